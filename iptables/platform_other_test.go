//go:build !linux

package iptables

import (
	"context"
	"errors"
	"testing"
)

func TestNewNotSupported(t *testing.T) {
	ipt, err := New(context.Background(), ProtocolIPv4)
	if ipt != nil || !errors.Is(err, ErrNotSupported) {
		t.Fatalf("New = %v, %v; want nil and ErrNotSupported", ipt, err)
	}
}
