package ebpf

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/logsafe"
)

// WithDryRun makes a Mode made without Maps (NewMode's m nil) print to
// out, after each sync, the elements its writer would hold in the three
// maps: the whole desired state, as a full sync would leave the kernel's
// maps, whatever the sync's kind. Nothing is loaded or attached. A nil
// out discards it.
func WithDryRun(out io.Writer) ModeOption {
	return func(b *Mode) { b.out = out }
}

// printDryRun writes the elements the writer wrote to the in-memory maps
// of a dry run to b.out: a comment line naming the family and the
// counts, then one line per element, each map's sorted by key. A
// frontend's line ends with the service port that owns it, the only text
// from the API, escaped.
func (b *Mode) printDryRun() error {
	w := b.w
	w.mu.Lock()
	s := w.written.Clone()
	owners := maps.Clone(w.owner)
	w.mu.Unlock()

	var sb strings.Builder
	fmt.Fprintf(&sb, "# %s: ebpf maps of the socket load balancer: %d services, %d slots, %d endpoints\n",
		b.family, len(s.Services), len(s.Slots), len(s.Endpoints))
	fronts := slices.SortedFunc(maps.Keys(s.Services), func(a, b Frontend) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
	})
	for _, f := range fronts {
		svc := s.Services[f]
		fmt.Fprintf(&sb, "service %s -> set %d count %d affinity %d %s # %s\n",
			f, svc.ID, svc.Count, svc.AffinitySeconds, flagNames(svc.Flags), ownerName(owners, f))
	}
	slots := slices.SortedFunc(maps.Keys(s.Slots), func(a, b SlotKey) int {
		return cmp.Or(cmp.Compare(a.Service, b.Service), cmp.Compare(a.Slot, b.Slot))
	})
	for _, k := range slots {
		fmt.Fprintf(&sb, "slot %d/%d -> endpoint %d\n", k.Service, k.Slot, s.Slots[k])
	}
	for _, id := range slices.Sorted(maps.Keys(s.Endpoints)) {
		ep := s.Endpoints[id]
		fmt.Fprintf(&sb, "endpoint %d -> set %d %s\n", id, ep.Service, ep.AddrPort())
	}
	_, err := io.WriteString(b.out, sb.String())
	return err
}

// flagNames names a frontend's kind: "cluster-ip" without a flag, else
// its flags joined by "|".
func flagNames(f Flags) string {
	var names []string
	for _, n := range []struct {
		flag Flags
		name string
	}{{FlagExternalIP, "external-ip"}, {FlagLoadBalancer, "load-balancer"}, {FlagNodePort, "node-port"}} {
		if f&n.flag != 0 {
			names = append(names, n.name)
			f &^= n.flag
		}
	}
	if f != 0 {
		names = append(names, fmt.Sprintf("0x%x", uint16(f)))
	}
	if len(names) == 0 {
		return "cluster-ip"
	}
	return strings.Join(names, "|")
}

// ownerName returns the service port that owns f, escaped: names come
// from the API.
func ownerName(owners map[Frontend]changetracker.ServicePortName, f Frontend) string {
	name, ok := owners[f]
	if !ok {
		return "(no owner)"
	}
	return logsafe.Quote(name.String())
}

// memMaps are the in-memory maps of a dry run: they hold what the writer
// writes and refuse nothing, but a frontend more than the services map
// holds, as the kernel's would.
type memMaps struct {
	family v1.IPFamily
	sizes  Sizes
	s      *State
}

var _ Maps = (*memMaps)(nil)

func newMemMaps(family v1.IPFamily) *memMaps {
	return &memMaps{family: family, sizes: Sizes{}.withDefaults(), s: NewState()}
}

func (m *memMaps) Family() v1.IPFamily { return m.family }
func (m *memMaps) Sizes() Sizes        { return m.sizes }

func (m *memMaps) UpdateServices(keys []Frontend, values []Service) (int, error) {
	for i, k := range keys {
		if _, ok := m.s.Services[k]; !ok && len(m.s.Services) >= m.sizes.Services {
			return i, mapFull("services", m.sizes.Services)
		}
		m.s.Services[k] = values[i]
	}
	return len(keys), nil
}

func (m *memMaps) DeleteServices(keys []Frontend) (int, error) { return memDelete(m.s.Services, keys) }

func (m *memMaps) UpdateSlots(keys []SlotKey, ids []uint32) (int, error) {
	return memUpdate(m.s.Slots, keys, ids)
}

func (m *memMaps) DeleteSlots(keys []SlotKey) (int, error) { return memDelete(m.s.Slots, keys) }

func (m *memMaps) UpdateEndpoints(ids []uint32, values []Endpoint) (int, error) {
	return memUpdate(m.s.Endpoints, ids, values)
}

func (m *memMaps) DeleteEndpoints(ids []uint32) (int, error) { return memDelete(m.s.Endpoints, ids) }

// memUpdate sets m[keys[i]] to values[i]: the dry run's slot and endpoint
// maps refuse nothing.
func memUpdate[K comparable, V any](m map[K]V, keys []K, values []V) (int, error) {
	for i, k := range keys {
		m[k] = values[i]
	}
	return len(keys), nil
}

func memDelete[K comparable, V any](m map[K]V, keys []K) (int, error) {
	for _, k := range keys {
		delete(m, k)
	}
	return len(keys), nil
}

func (m *memMaps) Dump() (*State, error) { return m.s.Clone(), nil }
