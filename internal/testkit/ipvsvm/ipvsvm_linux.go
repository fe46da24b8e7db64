// Package ipvsvm holds the network of the IPVS tests that run in the VM
// tier (hack/vmtest): a director namespace running IPVS, a client and
// backends. The ipvs and ipvsmode packages' VM tests share it.
package ipvsvm

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/ipvs"
)

// NS skips t outside the VM tier and returns a new namespace with an
// IPVS Interface and a dummy-interface binder in it.
func NS(t *testing.T) (*kerneltest.NS, *ipvs.Netlink, *ipvs.DummyBinder) {
	t.Helper()
	kerneltest.RequireVM(t)
	ns := kerneltest.NewNS(t)
	path := "/run/netns/" + ns.Name
	n, err := ipvs.New(context.Background(), ipvs.WithNetNSPath(path), ipvs.WithSchedulers("rr", "wrr", "sh"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	b, err := ipvs.NewDummyBinder(ipvs.WithNetNSPath(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return ns, n, b
}

// AddrStrings returns addrs as strings.
func AddrStrings(addrs []netip.Addr) []string {
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	return s
}

// Topology is a director namespace running IPVS, a client namespace and
// backend namespaces, each linked to the director, which routes between
// them. IPVS does not translate ports for a real server on a local
// address, hence namespaces of their own for the backends.
type Topology struct {
	Director, Client *kerneltest.NS
	Backends         []*kerneltest.NS
	ClientIP         netip.Addr
	// ClientLink is the client's end of its link to the director.
	ClientLink string
	BackendIPs []netip.Addr
	IFace      *ipvs.Netlink
	Binder     *ipvs.DummyBinder
}

// NewTopology returns a Topology with backends backend namespaces.
func NewTopology(t *testing.T, backends int) *Topology {
	t.Helper()
	d, n, b := NS(t)
	tp := &Topology{Director: d, Client: kerneltest.NewNS(t), IFace: n, Binder: b, ClientIP: netip.MustParseAddr("10.1.0.2")}
	tp.ClientLink = kerneltest.Link(t, tp.Client, d, netip.MustParsePrefix("10.1.0.2/24"), netip.MustParsePrefix("10.1.0.1/24")).A
	tp.Client.AddRoute(t, netip.Prefix{}, netip.MustParseAddr("10.1.0.1"))
	for i := range backends {
		ns := kerneltest.NewNS(t)
		ip := netip.AddrFrom4([4]byte{10, 2, byte(i), 2})
		gw := netip.AddrFrom4([4]byte{10, 2, byte(i), 1})
		kerneltest.Link(t, ns, d, netip.PrefixFrom(ip, 24), netip.PrefixFrom(gw, 24))
		ns.AddRoute(t, netip.Prefix{}, gw)
		tp.Backends = append(tp.Backends, ns)
		tp.BackendIPs = append(tp.BackendIPs, ip)
	}
	d.Sysctl(t, "net.ipv4.ip_forward", "1")
	return tp
}

// DialCount dials dst n times from the client and counts the replies per
// backend name, checking that every backend saw the client's own address.
func (tp *Topology) DialCount(t *testing.T, network string, dst netip.AddrPort, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		r, err := kerneltest.Dial(tp.Client, network, dst, 5*time.Second)
		if err != nil {
			t.Fatalf("%s to %s: %v", network, dst, err)
		}
		if r.Client != tp.ClientIP {
			t.Errorf("backend %s saw client %s, want %s", r.Name, r.Client, tp.ClientIP)
		}
		got[r.Name]++
	}
	return got
}
