//go:build !linux

package nftables

import (
	"runtime"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestUnsupportedHere checks that what needs nf_tables fails here with
// ErrNotSupported, naming the platform.
func TestUnsupportedHere(t *testing.T) {
	_, watchErr := WatchKernel(0)
	_, genErr := NewKernelState(0).Generation()
	for _, err := range []error{watchErr, genErr} {
		if !IsNotSupported(err) {
			t.Errorf("IsNotSupported(%v) = false", err)
		}
		if diff := cmp.Diff("nftables: not supported on "+runtime.GOOS, err.Error()); diff != "" {
			t.Errorf("error (-want +got):\n%s", diff)
		}
	}
}
