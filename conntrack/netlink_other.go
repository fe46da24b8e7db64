//go:build !linux

package conntrack

import (
	"context"
	"fmt"
	"runtime"

	v1 "k8s.io/api/core/v1"
)

// unsupported is the Interface of platforms without Linux conntrack.
type unsupported struct{}

var _ Interface = unsupported{}

func errNotSupported() error { return fmt.Errorf("%w on %s", ErrNotSupported, runtime.GOOS) }

// New returns an Interface whose methods all return an error wrapping
// ErrNotSupported; its options are ignored.
func New(...Option) Interface { return unsupported{} }

// ListFlows is part of Interface; it returns an error wrapping
// ErrNotSupported.
func (unsupported) ListFlows(context.Context, v1.IPFamily) ([]Flow, error) {
	return nil, errNotSupported()
}

// DeleteFlows is part of Interface; it returns an error wrapping
// ErrNotSupported.
func (unsupported) DeleteFlows(context.Context, v1.IPFamily, []Flow) (int, error) {
	return 0, errNotSupported()
}
