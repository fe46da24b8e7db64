//go:build !linux

package conntrack

import (
	"context"

	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"
)

// unsupported is the Interface of platforms without Linux conntrack.
type unsupported struct{}

var _ Interface = unsupported{}

// New returns an Interface whose methods all return ErrNotSupported.
func New() Interface { return unsupported{} }

// NewForHandle returns an Interface whose methods all return
// ErrNotSupported.
func NewForHandle(*netlink.Handle) Interface { return unsupported{} }

// ListFlows is part of Interface; it returns ErrNotSupported.
func (unsupported) ListFlows(context.Context, v1.IPFamily) ([]Flow, error) {
	return nil, ErrNotSupported
}

// DeleteFlows is part of Interface; it returns ErrNotSupported.
func (unsupported) DeleteFlows(context.Context, v1.IPFamily, []Flow) (int, error) {
	return 0, ErrNotSupported
}
