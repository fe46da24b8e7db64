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

// UpdateServices is part of Maps.
func (d *Datapath) UpdateServices([]Frontend, []Service) (int, error) { return 0, notSupported() }

// DeleteServices is part of Maps.
func (d *Datapath) DeleteServices([]Frontend) (int, error) { return 0, notSupported() }

// UpdateSlots is part of Maps.
func (d *Datapath) UpdateSlots([]SlotKey, []uint32) (int, error) { return 0, notSupported() }

// DeleteSlots is part of Maps.
func (d *Datapath) DeleteSlots([]SlotKey) (int, error) { return 0, notSupported() }

// UpdateEndpoints is part of Maps.
func (d *Datapath) UpdateEndpoints([]uint32, []Endpoint) (int, error) { return 0, notSupported() }

// DeleteEndpoints is part of Maps.
func (d *Datapath) DeleteEndpoints([]uint32) (int, error) { return 0, notSupported() }

// UpdateService writes one element, as UpdateServices does.
func (d *Datapath) UpdateService(Frontend, Service) error { return notSupported() }

// DeleteService deletes one element, as DeleteServices does.
func (d *Datapath) DeleteService(Frontend) error { return notSupported() }

// UpdateSlot writes one element, as UpdateSlots does.
func (d *Datapath) UpdateSlot(SlotKey, uint32) error { return notSupported() }

// DeleteSlot deletes one element, as DeleteSlots does.
func (d *Datapath) DeleteSlot(SlotKey) error { return notSupported() }

// UpdateEndpoint writes one element, as UpdateEndpoints does.
func (d *Datapath) UpdateEndpoint(uint32, Endpoint) error { return notSupported() }

// DeleteEndpoint deletes one element, as DeleteEndpoints does.
func (d *Datapath) DeleteEndpoint(uint32) error { return notSupported() }

// Dump is part of Maps.
func (d *Datapath) Dump() (*State, error) { return nil, notSupported() }

// Cleanup returns an error wrapping ErrNotSupported.
func Cleanup(cfg DatapathConfig) error { return notSupported() }

// FindLeftovers returns an error wrapping ErrNotSupported.
func FindLeftovers(cfg DatapathConfig) (bool, error) { return false, notSupported() }
