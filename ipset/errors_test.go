package ipset_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/ipset"
)

// TestErrorHelpers checks that each Is helper sees its sentinel through
// wrapping, as callers receive it, and no other.
func TestErrorHelpers(t *testing.T) {
	type verdict struct{ NotFound, AlreadyExists, InUse, TypeMismatch, NotSupported bool }
	for _, tc := range []struct {
		name string
		err  error
		want verdict
	}{
		{name: "nil"},
		{name: "unrelated", err: errors.New("netlink: no buffer space")},
		{name: "not found", err: fmt.Errorf("ipset A: listing: %w", ipset.ErrNotFound), want: verdict{NotFound: true}},
		{name: "already exists", err: fmt.Errorf("ipset A: creating: %w", ipset.ErrAlreadyExists), want: verdict{AlreadyExists: true}},
		{name: "in use", err: fmt.Errorf("ipset A: destroying: %w", ipset.ErrInUse), want: verdict{InUse: true}},
		{name: "type mismatch", err: fmt.Errorf("ipset A: swapping with B: %w", ipset.ErrTypeMismatch), want: verdict{TypeMismatch: true}},
		{name: "not supported", err: fmt.Errorf("%w on darwin", ipset.ErrNotSupported), want: verdict{NotSupported: true}},
		{name: "same text, other error", err: errors.New(ipset.ErrNotFound.Error())},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := verdict{
				NotFound: ipset.IsNotFound(tc.err), AlreadyExists: ipset.IsAlreadyExists(tc.err),
				InUse: ipset.IsInUse(tc.err), TypeMismatch: ipset.IsTypeMismatch(tc.err),
				NotSupported: ipset.IsNotSupported(tc.err),
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("verdicts on %v (-want +got):\n%s", tc.err, diff)
			}
		})
	}
	if got, want := ipset.ErrNotSupported.Error(), "ipset: not supported"; got != want {
		t.Errorf("ErrNotSupported = %q, want %q", got, want)
	}
}
