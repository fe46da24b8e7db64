//go:build !linux

package iptables

import (
	"context"
	"testing"
)

func TestNewNotSupported(t *testing.T) {
	ipt, err := New(context.Background(), ProtocolIPv4)
	if ipt != nil || !IsNotSupported(err) {
		t.Fatalf("New = %v, %v; want nil and ErrNotSupported", ipt, err)
	}
}
