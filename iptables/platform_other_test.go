//go:build !linux

package iptables

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func TestNewNotSupported(t *testing.T) {
	ipt, err := New(context.Background(), v1.IPv4Protocol)
	if ipt != nil || !IsNotSupported(err) {
		t.Fatalf("New = %v, %v; want nil and ErrNotSupported", ipt, err)
	}
}
