package conntracktest

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/conntrack"
)

// Fake is an in-memory conntrack table. It is safe for concurrent use.
type Fake struct {
	mu    sync.Mutex
	flows []conntrack.Flow
	// tuples holds the original and reply tuples of every flow in the
	// table; the kernel keeps each unique within a protocol and zone.
	tuples map[tupleKey]bool

	// ListError, when set, is returned by ListFlows instead of the flows.
	ListError error
	// DeleteError, when set, is returned by DeleteFlows, which then
	// deletes nothing.
	DeleteError error
	// Deleted records every flow DeleteFlows removed, in order.
	Deleted []conntrack.Flow
	// ListCalls and DeleteCalls count the calls of each method, failed
	// ones included.
	ListCalls, DeleteCalls int
}

var _ conntrack.Interface = (*Fake)(nil)

// NewFake returns an empty table.
func NewFake() *Fake { return &Fake{tuples: map[tupleKey]bool{}} }

// tupleKey is one direction of a flow, as the kernel hashes it.
type tupleKey struct {
	proto conntrack.Protocol
	zone  uint16
	tuple conntrack.Tuple
}

// tupleKeys returns the keys of fl's original and reply tuples; fl must be
// normalized.
func tupleKeys(fl conntrack.Flow) [2]tupleKey {
	return [2]tupleKey{{fl.Protocol, fl.Zone, fl.Original}, {fl.Protocol, fl.Zone, fl.Reply}}
}

// NewFlow returns the flow of a client's packet to frontend that was
// DNATed to backend: the original tuple goes from client to frontend, the
// reply from backend to client. A backend equal to frontend gives a flow
// that was not NATed (a packet that met no DNAT rule).
func NewFlow(proto conntrack.Protocol, client, frontend, backend netip.AddrPort) conntrack.Flow {
	return conntrack.Flow{
		Protocol: proto,
		Original: conntrack.Tuple{Src: client.Addr(), Dst: frontend.Addr(), SrcPort: client.Port(), DstPort: frontend.Port()},
		Reply:    conntrack.Tuple{Src: backend.Addr(), Dst: client.Addr(), SrcPort: backend.Port(), DstPort: client.Port()},
	}
}

// AddFlows adds flows to the table, as traffic would. Like the kernel, it
// refuses a flow whose addresses are not all valid and of one family, and
// a flow whose original or reply tuple is already used by another flow of
// the same protocol and zone; it then adds none of them.
func (f *Fake) AddFlows(flows ...conntrack.Flow) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tuples == nil {
		f.tuples = map[tupleKey]bool{}
	}
	added := map[tupleKey]bool{}
	for _, fl := range flows {
		if err := validate(fl); err != nil {
			return err
		}
		keys := tupleKeys(normalize(fl))
		for _, k := range keys {
			if f.tuples[k] || added[k] {
				return fmt.Errorf("flow %s clashes with a flow in the table", fl)
			}
		}
		for _, k := range keys {
			added[k] = true
		}
	}
	for k := range added {
		f.tuples[k] = true
	}
	f.flows = append(f.flows, flows...)
	return nil
}

func validate(fl conntrack.Flow) error {
	addrs := []netip.Addr{fl.Original.Src, fl.Original.Dst, fl.Reply.Src, fl.Reply.Dst}
	for _, a := range addrs {
		if !a.IsValid() || a.Unmap().Is4() != addrs[0].Unmap().Is4() {
			return fmt.Errorf("flow %s: addresses must be valid and of one family", fl)
		}
	}
	return nil
}

// normalize returns fl with IPv4-mapped IPv6 addresses made IPv4, so that
// equal flows compare equal.
func normalize(fl conntrack.Flow) conntrack.Flow {
	for _, t := range []*conntrack.Tuple{&fl.Original, &fl.Reply} {
		t.Src, t.Dst = t.Src.Unmap(), t.Dst.Unmap()
	}
	return fl
}

func ofFamily(fl conntrack.Flow, family v1.IPFamily) bool {
	is4 := fl.Original.Src.Unmap().Is4()
	return (family == v1.IPv4Protocol && is4) || (family == v1.IPv6Protocol && !is4)
}

func checkFamily(family v1.IPFamily) error {
	if family != v1.IPv4Protocol && family != v1.IPv6Protocol {
		return fmt.Errorf("conntrack: unknown IP family %q", family)
	}
	return nil
}

// ListFlows is part of conntrack.Interface. It returns copies, in the
// order the flows were added.
func (f *Fake) ListFlows(_ context.Context, family v1.IPFamily) ([]conntrack.Flow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ListCalls++
	if err := checkFamily(family); err != nil {
		return nil, err
	}
	if f.ListError != nil {
		return nil, f.ListError
	}
	out := make([]conntrack.Flow, 0, len(f.flows))
	for _, fl := range f.flows {
		if ofFamily(fl, family) {
			out = append(out, fl)
		}
	}
	return out, nil
}

// DeleteFlows is part of conntrack.Interface.
func (f *Fake) DeleteFlows(_ context.Context, family v1.IPFamily, flows []conntrack.Flow) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.DeleteCalls++
	if err := checkFamily(family); err != nil {
		return 0, err
	}
	if f.DeleteError != nil {
		return 0, f.DeleteError
	}
	doomed := make(map[conntrack.Flow]bool, len(flows))
	for _, d := range flows {
		doomed[normalize(d)] = true
	}
	n := 0
	f.flows = slices.DeleteFunc(f.flows, func(fl conntrack.Flow) bool {
		if !ofFamily(fl, family) || !doomed[normalize(fl)] {
			return false
		}
		for _, k := range tupleKeys(normalize(fl)) {
			delete(f.tuples, k)
		}
		f.Deleted = append(f.Deleted, fl)
		n++
		return true
	})
	return n, nil
}

// Flows returns a copy of every flow in the table, both families.
func (f *Fake) Flows() []conntrack.Flow {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.flows)
}

// Dump returns the table as text, one flow per line in conntrack -L form
// (see conntrack.Flow.String), sorted, each line ending in a newline; ""
// for an empty table.
func (f *Fake) Dump() string {
	f.mu.Lock()
	lines := make([]string, 0, len(f.flows))
	for _, fl := range f.flows {
		lines = append(lines, fl.String()+"\n")
	}
	f.mu.Unlock()
	slices.Sort(lines)
	return strings.Join(lines, "")
}
