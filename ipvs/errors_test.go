package ipvs_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/ipvs"
)

// TestErrorHelpers checks that each Is helper sees its sentinel through
// wrapping, as callers receive it, and no other.
func TestErrorHelpers(t *testing.T) {
	type verdict struct{ NotFound, AlreadyExists, NotSupported bool }
	for _, tc := range []struct {
		name string
		err  error
		want verdict
	}{
		{name: "nil"},
		{name: "unrelated", err: errors.New("netlink: no buffer space")},
		{name: "not found", err: fmt.Errorf("real server 10.0.0.1:80: %w", ipvs.ErrNotFound), want: verdict{NotFound: true}},
		{name: "already exists", err: fmt.Errorf("virtual server: %w", ipvs.ErrAlreadyExists), want: verdict{AlreadyExists: true}},
		{name: "not supported on another OS", err: fmt.Errorf("%w on darwin", ipvs.ErrNotSupported), want: verdict{NotSupported: true}},
		{name: "not supported: missing modules", err: fmt.Errorf("%w: %w", ipvs.ErrNotSupported, errors.New("missing IPVS modules ip_vs")), want: verdict{NotSupported: true}},
		{name: "same text, other error", err: errors.New(ipvs.ErrNotSupported.Error())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := verdict{NotFound: ipvs.IsNotFound(tc.err), AlreadyExists: ipvs.IsAlreadyExists(tc.err), NotSupported: ipvs.IsNotSupported(tc.err)}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("verdicts on %v (-want +got):\n%s", tc.err, diff)
			}
		})
	}
	if got, want := ipvs.ErrNotSupported.Error(), "ipvs: not supported"; got != want {
		t.Errorf("ErrNotSupported = %q, want %q", got, want)
	}
}
