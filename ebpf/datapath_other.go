//go:build !linux

package ebpf

import (
	"fmt"
	"runtime"

	v1 "k8s.io/api/core/v1"
)

// Datapath is one family's programs and maps; on this platform Open
// always fails.
type Datapath struct{}

var _ Maps = (*Datapath)(nil)

func notSupported() error { return fmt.Errorf("%w on %s", ErrNotSupported, runtime.GOOS) }

// Open returns an error wrapping ErrNotSupported.
func Open(cfg DatapathConfig) (*Datapath, error) { return nil, notSupported() }

// Close does nothing.
func (d *Datapath) Close() error { return nil }

// Family is part of Maps.
func (d *Datapath) Family() v1.IPFamily { return "" }

// Sizes is part of Maps.
func (d *Datapath) Sizes() Sizes { return Sizes{} }

// UpdateService is part of Maps.
func (d *Datapath) UpdateService(Frontend, Service) error { return notSupported() }

// DeleteService is part of Maps.
func (d *Datapath) DeleteService(Frontend) error { return notSupported() }

// UpdateSlot is part of Maps.
func (d *Datapath) UpdateSlot(SlotKey, uint32) error { return notSupported() }

// DeleteSlot is part of Maps.
func (d *Datapath) DeleteSlot(SlotKey) error { return notSupported() }

// UpdateEndpoint is part of Maps.
func (d *Datapath) UpdateEndpoint(uint32, Endpoint) error { return notSupported() }

// DeleteEndpoint is part of Maps.
func (d *Datapath) DeleteEndpoint(uint32) error { return notSupported() }

// Dump is part of Maps.
func (d *Datapath) Dump() (*State, error) { return nil, notSupported() }

// Cleanup returns an error wrapping ErrNotSupported.
func Cleanup(cfg DatapathConfig) error { return notSupported() }

// FindLeftovers returns an error wrapping ErrNotSupported.
func FindLeftovers(cfg DatapathConfig) (bool, error) { return false, notSupported() }
