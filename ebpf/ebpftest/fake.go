package ebpftest

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ebpf"
)

// Fake is an ebpf.Maps in memory. It refuses what the kernel refuses: an
// address of the other family, an update that adds an element to a full
// map (errors for which ebpf.IsMapFull is true), a protocol the maps have
// no number for. Its zero value is not usable: use NewFake.
type Fake struct {
	family v1.IPFamily
	sizes  ebpf.Sizes
	state  *ebpf.State
	// FailNext, when set, is returned by the next update or delete, once.
	FailNext error
	// Ops counts the element operations made since the fake was made.
	Ops int
}

var _ ebpf.Maps = (*Fake)(nil)

// NewFake returns empty maps of family with sizes (zero fields take
// ebpf.DefaultSizes').
func NewFake(family v1.IPFamily, sizes ebpf.Sizes) *Fake {
	def := ebpf.DefaultSizes
	if sizes.Services == 0 {
		sizes.Services = def.Services
	}
	if sizes.Endpoints == 0 {
		sizes.Endpoints = def.Endpoints
	}
	if sizes.Affinity == 0 {
		sizes.Affinity = def.Affinity
	}
	if sizes.RevNAT == 0 {
		sizes.RevNAT = def.RevNAT
	}
	return &Fake{family: family, sizes: sizes, state: ebpf.NewState()}
}

// Family is part of ebpf.Maps.
func (f *Fake) Family() v1.IPFamily { return f.family }

// Sizes is part of ebpf.Maps.
func (f *Fake) Sizes() ebpf.Sizes { return f.sizes }

func (f *Fake) op() error {
	f.Ops++
	if err := f.FailNext; err != nil {
		f.FailNext = nil
		return err
	}
	return nil
}

func (f *Fake) checkAddr(what string, ep interface{ Is4() bool }) error {
	if ep.Is4() != (f.family == v1.IPv4Protocol) {
		return fmt.Errorf("ebpftest: %s of the other family in %s maps", what, f.family)
	}
	return nil
}

// UpdateService is part of ebpf.Maps.
func (f *Fake) UpdateService(k ebpf.Frontend, v ebpf.Service) error {
	if err := f.op(); err != nil {
		return err
	}
	if err := f.checkAddr("frontend "+k.String(), k.Addr); err != nil {
		return err
	}
	if _, ok := ebpf.ProtocolNumber(k.Protocol); !ok {
		return fmt.Errorf("ebpftest: frontend %s: unknown protocol", k)
	}
	if _, ok := f.state.Services[k]; !ok && len(f.state.Services) >= f.sizes.Services {
		return fmt.Errorf("%w: services holds %d entries", ebpf.ErrMapFull, f.sizes.Services)
	}
	f.state.Services[k] = v
	return nil
}

// DeleteService is part of ebpf.Maps.
func (f *Fake) DeleteService(k ebpf.Frontend) error {
	if err := f.op(); err != nil {
		return err
	}
	delete(f.state.Services, k)
	return nil
}

// UpdateSlot is part of ebpf.Maps.
func (f *Fake) UpdateSlot(k ebpf.SlotKey, id uint32) error {
	if err := f.op(); err != nil {
		return err
	}
	if _, ok := f.state.Slots[k]; !ok && len(f.state.Slots) >= f.sizes.Endpoints {
		return fmt.Errorf("%w: slots holds %d entries", ebpf.ErrMapFull, f.sizes.Endpoints)
	}
	f.state.Slots[k] = id
	return nil
}

// DeleteSlot is part of ebpf.Maps.
func (f *Fake) DeleteSlot(k ebpf.SlotKey) error {
	if err := f.op(); err != nil {
		return err
	}
	delete(f.state.Slots, k)
	return nil
}

// UpdateEndpoint is part of ebpf.Maps.
func (f *Fake) UpdateEndpoint(id uint32, ep ebpf.Endpoint) error {
	if err := f.op(); err != nil {
		return err
	}
	if err := f.checkAddr("endpoint "+ep.AddrPort().String(), ep.Addr); err != nil {
		return err
	}
	if _, ok := f.state.Endpoints[id]; !ok && len(f.state.Endpoints) >= f.sizes.Endpoints {
		return fmt.Errorf("%w: endpoints holds %d entries", ebpf.ErrMapFull, f.sizes.Endpoints)
	}
	f.state.Endpoints[id] = ep
	return nil
}

// DeleteEndpoint is part of ebpf.Maps.
func (f *Fake) DeleteEndpoint(id uint32) error {
	if err := f.op(); err != nil {
		return err
	}
	delete(f.state.Endpoints, id)
	return nil
}

// Dump is part of ebpf.Maps. The returned State is a copy.
func (f *Fake) Dump() (*ebpf.State, error) { return f.state.Clone(), nil }

// State returns the fake's maps themselves, for a test to change behind
// the writer's back (drift).
func (f *Fake) State() *ebpf.State { return f.state }

// String returns the maps one element a line, sorted: frontends with
// their set, then each set's slots with their endpoints, so that two
// fakes that hold the same elements print the same.
func (f *Fake) String() string {
	var b strings.Builder
	fronts := slices.Collect(maps.Keys(f.state.Services))
	sort.Slice(fronts, func(i, j int) bool { return fronts[i].String() < fronts[j].String() })
	for _, k := range fronts {
		v := f.state.Services[k]
		fmt.Fprintf(&b, "service %s set=%d count=%d affinity=%d flags=%d\n", k, v.ID, v.Count, v.AffinitySeconds, v.Flags)
	}
	slots := slices.Collect(maps.Keys(f.state.Slots))
	sort.Slice(slots, func(i, j int) bool {
		if slots[i].Service != slots[j].Service {
			return slots[i].Service < slots[j].Service
		}
		return slots[i].Slot < slots[j].Slot
	})
	for _, k := range slots {
		id := f.state.Slots[k]
		ep, ok := f.state.Endpoints[id]
		target := "missing"
		if ok {
			target = ep.AddrPort().String()
		}
		fmt.Fprintf(&b, "slot %d/%d endpoint=%d %s\n", k.Service, k.Slot, id, target)
	}
	return b.String()
}
