package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// dumpAttempts bounds how often a table dump interrupted by concurrent
// changes is retried before ListFlows gives up.
const dumpAttempts = 3

// netlinkConntrack is Interface over netlink.
type netlinkConntrack struct {
	netnsPath string
}

var _ Interface = (*netlinkConntrack)(nil)

// New returns an Interface for the network namespace of the calling thread
// at the time of each call (the process's namespace, normally), or for the
// one [WithNetNSPath] names. It opens nothing itself, so there is nothing
// to close: each call opens its netlink socket and closes it before
// returning.
func New(opts ...Option) Interface {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return &netlinkConntrack{netnsPath: o.netnsPath}
}

// handle returns a netlink handle for one call, in the namespace of
// WithNetNSPath, and the function that closes it. The zero Handle opens a
// socket per request in the calling thread's namespace.
func (ct *netlinkConntrack) handle() (*netlink.Handle, func(), error) {
	if ct.netnsPath == "" {
		return &netlink.Handle{}, func() {}, nil
	}
	ns, err := netns.GetFromPath(ct.netnsPath)
	if err != nil {
		return nil, nil, fmt.Errorf("conntrack: opening network namespace %q: %w", ct.netnsPath, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, nil, fmt.Errorf("conntrack: netlink socket in %q: %w", ct.netnsPath, err)
	}
	return h, h.Close, nil
}

func inetFamily(family v1.IPFamily) (netlink.InetFamily, error) {
	switch family {
	case v1.IPv4Protocol:
		return unix.AF_INET, nil
	case v1.IPv6Protocol:
		return unix.AF_INET6, nil
	}
	return 0, checkFamily(family)
}

// ListFlows is part of Interface. A dump that the kernel reports as
// interrupted (the table changed under it) is retried a few times, then
// returned as an error wrapping netlink.ErrDumpInterrupted.
func (ct *netlinkConntrack) ListFlows(ctx context.Context, family v1.IPFamily) ([]Flow, error) {
	af, err := inetFamily(family)
	if err != nil {
		return nil, err
	}
	h, done, err := ct.handle()
	if err != nil {
		return nil, err
	}
	defer done()
	var raw []*netlink.ConntrackFlow
	for attempt := 1; ; attempt++ {
		raw, err = h.ConntrackTableList(netlink.ConntrackTable, af)
		if err == nil {
			break
		}
		if !errors.Is(err, netlink.ErrDumpInterrupted) || attempt == dumpAttempts {
			return nil, fmt.Errorf("listing %s conntrack flows: %w", family, err)
		}
		klog.FromContext(ctx).V(4).Info("Conntrack dump interrupted, retrying", "ipFamily", family, "attempt", attempt)
	}
	flows := make([]Flow, 0, len(raw))
	for _, f := range raw {
		flows = append(flows, fromNetlink(f))
	}
	return flows, nil
}

// DeleteFlows is part of Interface. netlink lists the table again and
// deletes each entry that matches, so an entry that changed since it was
// listed (a new flow with the same original tuple but another reply) is
// not deleted.
func (ct *netlinkConntrack) DeleteFlows(ctx context.Context, family v1.IPFamily, flows []Flow) (int, error) {
	af, err := inetFamily(family)
	if err != nil {
		return 0, err
	}
	filter := flowSet{}
	for _, f := range flows {
		if familyOf(f.Original.Src, family) {
			filter[f.key()] = struct{}{}
		}
	}
	if len(filter) == 0 {
		return 0, nil
	}
	h, done, err := ct.handle()
	if err != nil {
		return 0, err
	}
	defer done()
	n, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, af, filter)
	if err != nil {
		return int(n), fmt.Errorf("deleting %d %s conntrack flows (%d deleted): %w", len(filter), family, n, err)
	}
	return int(n), nil
}

// flowSet matches the flows whose keys it holds; it is the one filter
// DeleteFlows passes to netlink, so matching costs one map lookup per entry
// whatever the number of flows to delete (kubernetes#129982).
type flowSet map[flowKey]struct{}

// MatchConntrackFlow is part of netlink.CustomConntrackFilter.
func (s flowSet) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	_, ok := s[fromNetlink(f).key()]
	return ok
}

func fromNetlink(f *netlink.ConntrackFlow) Flow {
	return Flow{
		Protocol: Protocol(f.Forward.Protocol),
		Original: fromIPTuple(f.Forward),
		Reply:    fromIPTuple(f.Reverse),
		Zone:     f.Zone,
	}
}

func fromIPTuple(t netlink.IPTuple) Tuple {
	return Tuple{Src: addrOf(t.SrcIP), Dst: addrOf(t.DstIP), SrcPort: t.SrcPort, DstPort: t.DstPort}
}

func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}
