package kerneltest

import (
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

var linkCounter atomic.Uint64

// Veth is a veth pair made by [Link]: interface A in one namespace, B in
// the other.
type Veth struct {
	A, B string
}

// Link connects namespaces a and b with a veth pair, gives each end the
// addresses given (aAddr on a's end, bAddr on b's end; either may be the
// zero Prefix for none) and sets both ends up. The interface names are
// unique in this process. IPv6 addresses skip duplicate address detection so
// they are usable at once.
func Link(t testing.TB, a, b *NS, aAddr, bAddr netip.Prefix) Veth {
	t.Helper()
	n := linkCounter.Add(1)
	v := Veth{A: fmt.Sprintf("pka%d", n), B: fmt.Sprintf("pkb%d", n)}
	ha := a.nl(t)
	defer ha.Close()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: v.A},
		PeerName:      v.B,
		PeerNamespace: netlink.NsFd(int(b.handle)),
	}
	if err := ha.LinkAdd(veth); err != nil {
		t.Fatalf("veth %s(%s) <-> %s(%s): %v", v.A, a.Name, v.B, b.Name, err)
	}
	if aAddr.IsValid() {
		a.AddAddr(t, v.A, aAddr)
	}
	if bAddr.IsValid() {
		b.AddAddr(t, v.B, bAddr)
	}
	a.SetUp(t, v.A)
	b.SetUp(t, v.B)
	return v
}

// AddAddr adds an address to an interface of the namespace. IPv6 addresses
// skip duplicate address detection.
func (n *NS) AddAddr(t testing.TB, ifname string, prefix netip.Prefix) {
	t.Helper()
	h := n.nl(t)
	defer h.Close()
	link := n.link(t, h, ifname)
	addr := &netlink.Addr{IPNet: &net.IPNet{
		IP:   prefix.Addr().AsSlice(),
		Mask: net.CIDRMask(prefix.Bits(), prefix.Addr().BitLen()),
	}}
	if prefix.Addr().Is6() {
		addr.Flags = unix.IFA_F_NODAD
	}
	if err := h.AddrAdd(link, addr); err != nil {
		t.Fatalf("netns %s: adding %s to %s: %v", n.Name, prefix, ifname, err)
	}
}

// SetUp sets an interface of the namespace up.
func (n *NS) SetUp(t testing.TB, ifname string) {
	t.Helper()
	h := n.nl(t)
	defer h.Close()
	if err := h.LinkSetUp(n.link(t, h, ifname)); err != nil {
		t.Fatalf("netns %s: setting %s up: %v", n.Name, ifname, err)
	}
}

// AddRoute adds a route to dst through the gateway via, which must be
// reachable on a connected network of the namespace. A zero dst is the
// default route of via's family.
func (n *NS) AddRoute(t testing.TB, dst netip.Prefix, via netip.Addr) {
	t.Helper()
	h := n.nl(t)
	defer h.Close()
	route := &netlink.Route{Gw: via.AsSlice()}
	if dst.IsValid() {
		route.Dst = &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())}
	} else if via.Is6() {
		route.Dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
	} else {
		route.Dst = &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
	}
	if err := h.RouteAdd(route); err != nil {
		t.Fatalf("netns %s: route %s via %s: %v", n.Name, dst, via, err)
	}
}

// AddBridge creates a bridge in the namespace and sets it up.
func (n *NS) AddBridge(t testing.TB, name string) {
	t.Helper()
	h := n.nl(t)
	defer h.Close()
	if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
		t.Fatalf("netns %s: bridge %s: %v", n.Name, name, err)
	}
	n.SetUp(t, name)
}

// AttachToBridge makes ifname a port of bridge, with hairpin mode on so that
// a pod behind that port can reach itself through a service address (new
// namespaces have bridge netfilter on, and a packet DNATed back to its
// sender must leave through the port it came in on).
func (n *NS) AttachToBridge(t testing.TB, ifname, bridge string) {
	t.Helper()
	h := n.nl(t)
	defer h.Close()
	port, br := n.link(t, h, ifname), n.link(t, h, bridge)
	if err := h.LinkSetMaster(port, br); err != nil {
		t.Fatalf("netns %s: %s into bridge %s: %v", n.Name, ifname, bridge, err)
	}
	if err := h.LinkSetHairpin(port, true); err != nil {
		t.Fatalf("netns %s: hairpin on %s: %v", n.Name, ifname, err)
	}
}

func (n *NS) link(t testing.TB, h *netlink.Handle, name string) netlink.Link {
	t.Helper()
	link, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("netns %s: link %s: %v", n.Name, name, err)
	}
	return link
}

// nl opens a netlink handle in the namespace for one operation; the caller
// closes it.
func (n *NS) nl(t testing.TB) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(n.handle)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", n.Name, err)
	}
	return h
}
