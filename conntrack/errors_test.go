package conntrack_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/kernel"
)

func TestIsNotSupported(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{name: "nil"},
		{name: "the sentinel", err: conntrack.ErrNotSupported, want: true},
		{name: "wrapped with the OS", err: fmt.Errorf("listing flows: %w on darwin", conntrack.ErrNotSupported), want: true},
		{name: "another package's", err: kernel.ErrNotSupported},
		{name: "same text, other error", err: errors.New(conntrack.ErrNotSupported.Error())},
	} {
		if got := conntrack.IsNotSupported(tc.err); got != tc.want {
			t.Errorf("%s: IsNotSupported(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
	if got, want := conntrack.ErrNotSupported.Error(), "conntrack: not supported"; got != want {
		t.Errorf("ErrNotSupported = %q, want %q", got, want)
	}
}
