package ebpftest

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ebpf"
)

// Fake is an ebpf.Maps in memory. It refuses what the kernel refuses: an
// address of the other family, an update that adds an element to a full
// map (errors for which ebpf.IsMapFull is true), a protocol the maps have
// no number for; like the kernel's batches, a call stops at the first
// element refused and returns how many it wrote. Its zero value is not
// usable: use NewFake.
type Fake struct {
	family v1.IPFamily
	sizes  ebpf.Sizes
	state  *ebpf.State
	// FailNext, when set, is returned by the next Update or Delete call,
	// once, before it writes anything.
	FailNext error
	// Ops counts the element operations made since the fake was made,
	// and Calls the Update and Delete calls that made them.
	Ops, Calls int
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

func (f *Fake) call() error {
	f.Calls++
	if err := f.FailNext; err != nil {
		f.FailNext = nil
		return err
	}
	return nil
}

// otherFamily reports whether a is not of the maps' family.
func (f *Fake) otherFamily(a netip.Addr) bool { return a.Is4() != (f.family == v1.IPv4Protocol) }

// update writes keys[i] → values[i] into m of capacity size in order,
// stopping at the first element check refuses or that finds m full.
func update[K comparable, V any](f *Fake, m map[K]V, name string, size int, keys []K, values []V, check func(K, V) error) (int, error) {
	if err := f.call(); err != nil {
		return 0, err
	}
	if len(keys) != len(values) {
		return 0, fmt.Errorf("ebpftest: %d keys and %d values for %s", len(keys), len(values), name)
	}
	for i, k := range keys {
		f.Ops++
		if check != nil {
			if err := check(k, values[i]); err != nil {
				return i, err
			}
		}
		if _, ok := m[k]; !ok && len(m) >= size {
			return i, fmt.Errorf("%w: %s holds %d entries", ebpf.ErrMapFull, name, size)
		}
		m[k] = values[i]
	}
	return len(keys), nil
}

// remove deletes keys from m; missing keys are no error.
func remove[K comparable, V any](f *Fake, m map[K]V, keys []K) (int, error) {
	if err := f.call(); err != nil {
		return 0, err
	}
	for _, k := range keys {
		f.Ops++
		delete(m, k)
	}
	return len(keys), nil
}

// UpdateServices is part of ebpf.Maps.
func (f *Fake) UpdateServices(keys []ebpf.Frontend, values []ebpf.Service) (int, error) {
	return update(f, f.state.Services, "services", f.sizes.Services, keys, values, func(k ebpf.Frontend, _ ebpf.Service) error {
		if f.otherFamily(k.Addr) {
			return fmt.Errorf("ebpftest: frontend %s of the other family in %s maps", k, f.family)
		}
		if _, ok := ebpf.ProtocolNumber(k.Protocol); !ok {
			return fmt.Errorf("ebpftest: frontend %s: unknown protocol", k)
		}
		return nil
	})
}

// DeleteServices is part of ebpf.Maps.
func (f *Fake) DeleteServices(keys []ebpf.Frontend) (int, error) {
	return remove(f, f.state.Services, keys)
}

// UpdateSlots is part of ebpf.Maps.
func (f *Fake) UpdateSlots(keys []ebpf.SlotKey, ids []uint32) (int, error) {
	return update(f, f.state.Slots, "slots", f.sizes.Endpoints, keys, ids, nil)
}

// DeleteSlots is part of ebpf.Maps.
func (f *Fake) DeleteSlots(keys []ebpf.SlotKey) (int, error) {
	return remove(f, f.state.Slots, keys)
}

// UpdateEndpoints is part of ebpf.Maps.
func (f *Fake) UpdateEndpoints(ids []uint32, values []ebpf.Endpoint) (int, error) {
	return update(f, f.state.Endpoints, "endpoints", f.sizes.Endpoints, ids, values, func(_ uint32, ep ebpf.Endpoint) error {
		if f.otherFamily(ep.Addr) {
			return fmt.Errorf("ebpftest: endpoint %s of the other family in %s maps", ep.AddrPort(), f.family)
		}
		return nil
	})
}

// DeleteEndpoints is part of ebpf.Maps.
func (f *Fake) DeleteEndpoints(ids []uint32) (int, error) {
	return remove(f, f.state.Endpoints, ids)
}

// UpdateService writes one element, as UpdateServices does.
func (f *Fake) UpdateService(k ebpf.Frontend, v ebpf.Service) error {
	_, err := f.UpdateServices([]ebpf.Frontend{k}, []ebpf.Service{v})
	return err
}

// DeleteService deletes one element, as DeleteServices does.
func (f *Fake) DeleteService(k ebpf.Frontend) error {
	_, err := f.DeleteServices([]ebpf.Frontend{k})
	return err
}

// UpdateSlot writes one element, as UpdateSlots does.
func (f *Fake) UpdateSlot(k ebpf.SlotKey, id uint32) error {
	_, err := f.UpdateSlots([]ebpf.SlotKey{k}, []uint32{id})
	return err
}

// DeleteSlot deletes one element, as DeleteSlots does.
func (f *Fake) DeleteSlot(k ebpf.SlotKey) error {
	_, err := f.DeleteSlots([]ebpf.SlotKey{k})
	return err
}

// UpdateEndpoint writes one element, as UpdateEndpoints does.
func (f *Fake) UpdateEndpoint(id uint32, ep ebpf.Endpoint) error {
	_, err := f.UpdateEndpoints([]uint32{id}, []ebpf.Endpoint{ep})
	return err
}

// DeleteEndpoint deletes one element, as DeleteEndpoints does.
func (f *Fake) DeleteEndpoint(id uint32) error {
	_, err := f.DeleteEndpoints([]uint32{id})
	return err
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
