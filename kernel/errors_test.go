package kernel

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestErrorHelpers checks that the Is helpers see their sentinel through
// wrapping, as callers receive it, and nothing else.
func TestErrorHelpers(t *testing.T) {
	type verdict struct{ ReadOnly, NotSupported bool }
	for _, tc := range []struct {
		name string
		err  error
		want verdict
	}{
		{name: "nil", err: nil},
		{name: "unrelated", err: fs.ErrPermission},
		{name: "read-only", err: ErrReadOnly, want: verdict{ReadOnly: true}},
		{name: "read-only wrapped twice", err: fmt.Errorf("writing %s: %w (%w)", SysctlIPForward, ErrReadOnly, fs.ErrPermission), want: verdict{ReadOnly: true}},
		{name: "not supported", err: ErrNotSupported, want: verdict{NotSupported: true}},
		{name: "not supported wrapped", err: fmt.Errorf("%w on darwin", ErrNotSupported), want: verdict{NotSupported: true}},
		{name: "same text, other error", err: errors.New(ErrReadOnly.Error())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := verdict{ReadOnly: IsReadOnly(tc.err), NotSupported: IsNotSupported(tc.err)}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("verdicts on %v (-want +got):\n%s", tc.err, diff)
			}
		})
	}
}

func TestErrNotSupportedWording(t *testing.T) {
	if got, want := ErrNotSupported.Error(), "kernel: not supported"; got != want {
		t.Errorf("ErrNotSupported = %q, want %q", got, want)
	}
}
