package ebpf

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"

	v1 "k8s.io/api/core/v1"
)

// Flags says what kind of address a Frontend is, for readers of the maps
// (the tracer, a packet-level program); the cgroup programs translate
// every kind alike.
type Flags uint16

// The kinds of frontend besides a cluster IP, which has no flag. They are
// the LB_FLAG_* values of bpf/lb.h.
const (
	FlagExternalIP   Flags = 0x1
	FlagLoadBalancer Flags = 0x2
	FlagNodePort     Flags = 0x4
)

// Frontend is a key of the services map: an address, port and protocol a
// client sends to. Addr is of the map's family (IPv4 for the lb4 maps).
type Frontend struct {
	Addr     netip.Addr
	Port     uint16
	Protocol v1.Protocol
}

// String returns "addr:port/PROTOCOL", as ServicePort.String does.
func (f Frontend) String() string {
	return netip.AddrPortFrom(f.Addr, f.Port).String() + "/" + string(f.Protocol)
}

// Service is a value of the services map: the backend set a frontend
// sends to. Count zero makes connect and sendmsg fail with ECONNREFUSED.
type Service struct {
	// ID names the backend set, whose endpoints are in slots 0 to
	// Count-1 of the slot map; never 0.
	ID    uint32
	Count uint32
	// AffinitySeconds is the ClientIP affinity timeout; 0 for none.
	AffinitySeconds uint32
	Flags           Flags
}

// SlotKey is a key of the slot map: the slot of a backend set, whose
// value is an endpoint id.
type SlotKey struct {
	Service uint32
	Slot    uint32
}

// Endpoint is a value of the endpoint map, keyed by endpoint id: where a
// socket is sent, and the backend set the id belongs to.
type Endpoint struct {
	Service uint32
	Addr    netip.Addr
	Port    uint16
}

// AddrPort returns the endpoint's address and port.
func (e Endpoint) AddrPort() netip.AddrPort { return netip.AddrPortFrom(e.Addr, e.Port) }

// State is the content of one family's services, slot and endpoint maps
// (the affinity and reverse-translation maps are the programs' own and
// are not part of it).
type State struct {
	Services  map[Frontend]Service
	Slots     map[SlotKey]uint32
	Endpoints map[uint32]Endpoint
}

// NewState returns an empty State.
func NewState() *State {
	return &State{
		Services:  map[Frontend]Service{},
		Slots:     map[SlotKey]uint32{},
		Endpoints: map[uint32]Endpoint{},
	}
}

// Clone returns a copy of s that shares nothing with it.
func (s *State) Clone() *State {
	return &State{Services: maps.Clone(s.Services), Slots: maps.Clone(s.Slots), Endpoints: maps.Clone(s.Endpoints)}
}

// Sizes are the capacities of one family's maps, in entries.
type Sizes struct {
	// Services bounds the frontends: every cluster IP, external IP,
	// load-balancer VIP and node port on a node address of every service
	// port. Zero means DefaultSizes' value.
	Services int
	// Endpoints bounds the endpoint ids (and the slots, one per id): each
	// endpoint of each backend set takes one, so an endpoint of a port
	// whose internal and external traffic policies pick different sets
	// takes two. Zero means DefaultSizes' value.
	Endpoints int
	// Affinity bounds the ClientIP affinity entries (an LRU map: the
	// least recently used entry makes room). Zero means DefaultSizes'.
	Affinity int
	// RevNAT bounds the entries that give recvmsg and getpeername the
	// Service address back, one per translated socket and endpoint (an
	// LRU map: a socket whose entry was evicted sees the endpoint's
	// address). Zero means DefaultSizes' value.
	RevNAT int
}

// DefaultSizes are the sizes used for the fields of Sizes left zero.
var DefaultSizes = Sizes{Services: 65536, Endpoints: 524288, Affinity: 65536, RevNAT: 262144}

// withDefaults returns s with zero fields set from DefaultSizes.
func (s Sizes) withDefaults() Sizes {
	def := func(v, d int) int {
		if v == 0 {
			return d
		}
		return v
	}
	return Sizes{
		Services:  def(s.Services, DefaultSizes.Services),
		Endpoints: def(s.Endpoints, DefaultSizes.Endpoints),
		Affinity:  def(s.Affinity, DefaultSizes.Affinity),
		RevNAT:    def(s.RevNAT, DefaultSizes.RevNAT),
	}
}

func (s Sizes) validate() error {
	for _, f := range []struct {
		name string
		v    int
	}{{"services", s.Services}, {"endpoints", s.Endpoints}, {"affinity", s.Affinity}, {"revnat", s.RevNAT}} {
		if f.v < 1 || f.v > 1<<24 {
			return fmt.Errorf("ebpf: %s map size %d out of range 1 to %d", f.name, f.v, 1<<24)
		}
	}
	return nil
}

// Maps is one family's services, slot and endpoint maps, as the Writer
// writes them: the kernel's (Datapath) or a fake's (ebpftest.Fake).
//
// Each Update and Delete method writes its elements in order, as few
// operations as the maps allow (one batch on a kernel that has them), and
// returns how many it wrote; after an error the element at that index
// failed and those after it were not written. Deleting a missing element
// is not an error. An update that does not fit returns an error for
// which IsMapFull is true.
type Maps interface {
	// Family is the family of the maps' addresses.
	Family() v1.IPFamily
	// Sizes returns the maps' capacities.
	Sizes() Sizes
	// UpdateServices sets the services map's element of keys[i] to
	// values[i]; the two have the same length.
	UpdateServices(keys []Frontend, values []Service) (int, error)
	DeleteServices(keys []Frontend) (int, error)
	// UpdateSlots sets the slot keys[i] to the endpoint id ids[i].
	UpdateSlots(keys []SlotKey, ids []uint32) (int, error)
	DeleteSlots(keys []SlotKey) (int, error)
	// UpdateEndpoints sets the endpoint of id ids[i] to values[i].
	UpdateEndpoints(ids []uint32, values []Endpoint) (int, error)
	DeleteEndpoints(ids []uint32) (int, error)
	// Dump reads the three maps whole.
	Dump() (*State, error)
}

// ErrMapFull is wrapped by the error of an update that found its map
// full; the error names the map and its size. Test for it with
// [IsMapFull].
var ErrMapFull = errors.New("ebpf: map full")

// IsMapFull reports whether err, or an error it wraps, is [ErrMapFull].
func IsMapFull(err error) bool { return errors.Is(err, ErrMapFull) }

// ErrNotSupported is wrapped by the errors of what needs the BPF syscall
// on a platform without it (every platform but Linux); the error names
// the operating system. Test for it with [IsNotSupported].
var ErrNotSupported = errors.New("ebpf: not supported")

// IsNotSupported reports whether err, or an error it wraps, is
// [ErrNotSupported].
func IsNotSupported(err error) bool { return errors.Is(err, ErrNotSupported) }

// mapFull returns the error of an update of a full map.
func mapFull(name string, size int) error {
	return fmt.Errorf("%w: %s holds %d entries; raise its Sizes field", ErrMapFull, name, size)
}
