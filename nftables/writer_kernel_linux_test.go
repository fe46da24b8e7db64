package nftables_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxy"
)

// TestWriterKernel applies a full sync and partial syncs with the real nft
// in a throwaway node namespace, for each family, and sends real
// connections from a client namespace to a ClusterIP and a NodePort:
// they reach the pods the rules say; after a partial sync that drops an
// endpoint they reach only the other; after one that drops all, they are
// refused; a pod that reaches itself through the service is masqueraded
// (hairpin) and one that reaches another pod is not; and no chain of the
// dropped endpoints or service is left (they
// are deleted in the same transaction as the elements and rules that
// referred to them). A load balancer serves a client inside its source
// ranges and drops it once they change, and a UDP service answers at its
// cluster IP and node port. A table deleted by hand is repaired by the full sync
// that follows the failed partial one, and Cleanup deletes the writer's
// table and no other.
func TestWriterKernel(t *testing.T) {
	kerneltest.Require(t, "nft")
	nw := newWriterNetwork(t)
	for _, tc := range []struct {
		family                   v1.IPFamily
		nodeIP, clusterIP, cidr  string
		bridgeIP                 string
		podA, podB, serviceCIDR  string
		nftFamily                knftables.Family
		vip, clientNet, otherNet string
	}{
		{v1.IPv4Protocol, "10.1.0.1", "10.96.0.10", "10.0.0.0/16", "10.0.0.1", "10.0.0.11", "10.0.0.12", "10.96.0.0/16", knftables.IPv4Family,
			"203.0.113.5", "10.1.0.0/24", "192.0.2.0/24"},
		{v1.IPv6Protocol, "fd01::1", "fd00:96::10", "fd00:10::/64", "fd00:10::1", "fd00:10::11", "fd00:10::12", "fd00:96::/64", knftables.IPv6Family,
			"2001:db8::5", "fd01::/64", "2001:db8:1::/64"},
	} {
		t.Run(string(tc.family), func(t *testing.T) {
			nft := nsNFT(t, nw.Node, tc.nftFamily)
			w, err := nftables.NewWriter(nft, nftables.WriterConfig{
				Family:       tc.family,
				Node:         proxy.NodeConfig{Name: "node-a", ClusterCIDRs: []netip.Prefix{prefix(tc.cidr)}},
				ServiceCIDRs: []netip.Prefix{prefix(tc.serviceCIDR)},
			})
			if err != nil {
				t.Fatal(err)
			}
			apply := func(in *proxy.FamilyInput, wantFull bool) {
				t.Helper()
				applyIn(t, nw.Node, nft, w, in, wantFull)
			}
			// reach connects to dst until both pods answered, up to 40
			// times: each connection's pod is a random draw, and 12
			// tries, as before, missed one of two pods by chance once in
			// 2,048 checks (see TestWriterResyncKernel's serves).
			reach := func(dst netip.AddrPort) map[string]bool {
				t.Helper()
				seen := map[string]bool{}
				for i := 0; i < 40 && !(seen["pod-a"] && seen["pod-b"]); i++ {
					r, err := kerneltest.Dial(nw.Client, "tcp", dst, 3*time.Second)
					if err != nil {
						t.Fatalf("connecting to %s: %v", dst, err)
					}
					seen[r.Name] = true
					// The client is outside the cluster CIDR: masqueraded
					// to the node's address on the pods' bridge.
					if r.Client != addr(tc.bridgeIP) {
						t.Errorf("%s: backend saw client %s, want the masqueraded %s", dst, r.Client, tc.bridgeIP)
					}
				}
				return seen
			}
			clusterIP := netip.AddrPortFrom(addr(tc.clusterIP), 80)
			nodePort := netip.AddrPortFrom(addr(tc.nodeIP), 30080)

			c := newCluster(tc.family, "node-a")

			c.NodeIPs = []netip.Addr{addr(tc.nodeIP)}
			c.setService(makeService("ns", "web", tc.clusterIP, withNodePort(30080)))
			c.setEndpoints("ns", "web", tcp8080, local(tc.podA), local(tc.podB))
			apply(c.input(), true)
			for _, dst := range []netip.AddrPort{clusterIP, nodePort} {
				if got := reach(dst); !got["pod-a"] || !got["pod-b"] {
					t.Errorf("%s reached %v, want both pods", dst, got)
				}
			}

			// Hairpin: a pod that reaches itself through the service is
			// masqueraded (to the node's bridge address), or it would
			// answer itself; one that reaches the other pod keeps its
			// address, since it is inside the cluster CIDR.
			seen := map[string]bool{}
			for range 16 {
				r, err := kerneltest.Dial(nw.Pods["pod-a"], "tcp", clusterIP, 3*time.Second)
				if err != nil {
					t.Fatalf("pod-a connecting to %s: %v", clusterIP, err)
				}
				seen[r.Name] = true
				want := addr(tc.podA)
				if r.Name == "pod-a" {
					want = addr(tc.bridgeIP)
				}
				if r.Client != want {
					t.Errorf("pod-a through %s reached %s, which saw client %s; want %s", clusterIP, r.Name, r.Client, want)
				}
			}
			if !seen["pod-a"] || !seen["pod-b"] {
				t.Errorf("pod-a through %s reached %v, want both pods", clusterIP, seen)
			}

			c.setEndpoints("ns", "web", tcp8080, local(tc.podB))
			apply(c.input(), false)
			for _, dst := range []netip.AddrPort{clusterIP, nodePort} {
				if got := reach(dst); len(got) != 1 || !got["pod-b"] {
					t.Errorf("after the partial sync %s reached %v, want pod-b only", dst, got)
				}
			}

			c.setEndpoints("ns", "web", tcp8080)
			apply(c.input(), false)
			for _, dst := range []netip.AddrPort{clusterIP, nodePort} {
				if _, err := kerneltest.Dial(nw.Client, "tcp", dst, 3*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
					t.Errorf("%s without endpoints: %v, want connection refused", dst, err)
				}
			}
			listing := nw.Node.MustExec(t, "nft", "list", "chains", string(tc.nftFamily))
			if strings.Contains(listing, "ns/web") {
				t.Errorf("chains of the service are left without endpoints:\n%s", listing)
			}

			// A full resync of the same state changes nothing that
			// matters, and the service comes back with a partial sync.
			w.RequestFullSync()
			apply(c.input(), true)
			c.setEndpoints("ns", "web", tcp8080, local(tc.podA))
			apply(c.input(), false)
			if got := reach(clusterIP); len(got) != 1 || !got["pod-a"] {
				t.Errorf("after the service came back, %s reached %v, want pod-a", clusterIP, got)
			}

			// A table deleted by hand fails the next partial sync; the
			// sync after it is full and brings everything back. Another
			// program's table is left alone throughout.
			nw.Node.MustExec(t, "nft", "add", "table", string(tc.nftFamily), "other")
			nw.Node.MustExec(t, "nft", "add", "chain", string(tc.nftFamily), "other", "keep")
			nw.Node.MustExec(t, "nft", "delete", "table", string(tc.nftFamily), nftables.DefaultTableName)
			c.setEndpoints("ns", "web", tcp8080, local(tc.podA), local(tc.podB))
			res := syncIn(t, nw.Node, w, c.input())
			err = nw.Node.Do(func() error { return nft.Run(context.Background(), res.Transaction) })
			w.Applied(err)
			if res.Full || err == nil {
				t.Fatalf("partial sync on a deleted table: full=%v, error %v; want a failed partial sync", res.Full, err)
			}
			apply(c.input(), true)
			for _, dst := range []netip.AddrPort{clusterIP, nodePort} {
				if got := reach(dst); !got["pod-a"] || !got["pod-b"] {
					t.Errorf("after the repair %s reached %v, want both pods", dst, got)
				}
			}

			// A load balancer's source ranges: the client's range is
			// served; after a partial sync that allows another range
			// only, the client's connections are dropped.
			vip := netip.AddrPortFrom(addr(tc.vip), 80)
			c.setService(makeService("ns", "lb", tc.clusterIP[:len(tc.clusterIP)-2]+"20", withLoadBalancer(tc.vip, tc.clientNet, tc.otherNet)))
			c.setEndpoints("ns", "lb", tcp8080, local(tc.podB))
			apply(c.input(), false)
			if got := reach(vip); len(got) != 1 || !got["pod-b"] {
				t.Errorf("load balancer %s reached %v from an allowed source, want pod-b", vip, got)
			}
			c.setService(makeService("ns", "lb", tc.clusterIP[:len(tc.clusterIP)-2]+"20", withLoadBalancer(tc.vip, tc.otherNet)))
			apply(c.input(), false)
			if r, err := kerneltest.Dial(nw.Client, "tcp", vip, time.Second); !kerneltest.IsTimeout(err) {
				t.Errorf("load balancer %s from a source outside its ranges: reply %+v, error %v; want a timeout (dropped)", vip, r, err)
			}

			// UDP, through the shared chains' "udp dport" lookup of the
			// endpoints maps (declared with tcp dport), at a cluster IP
			// and a node port.
			c.setService(makeService("ns", "dns", tc.clusterIP[:len(tc.clusterIP)-2]+"30",
				withPorts(v1.ServicePort{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP}), withNodePort(30053)))
			c.setEndpoints("ns", "dns", []discoveryv1.EndpointPort{slicePort("dns", 8080, v1.ProtocolUDP)}, local(tc.podA))
			apply(c.input(), false)
			for _, dst := range []netip.AddrPort{netip.AddrPortFrom(addr(tc.clusterIP[:len(tc.clusterIP)-2]+"30"), 53), netip.AddrPortFrom(addr(tc.nodeIP), 30053)} {
				r, err := kerneltest.Dial(nw.Client, "udp", dst, 3*time.Second)
				if err != nil || r.Name != "pod-a" {
					t.Errorf("UDP to %s: reply %+v, error %v; want pod-a", dst, r, err)
				}
			}

			if err := nftables.Cleanup(context.Background(), "", func(f knftables.Family, table string) (knftables.Interface, error) {
				var i knftables.Interface
				err := nw.Node.Do(func() (err error) { i, err = knftables.New(f, table); return err })
				return &nsInterface{Interface: i, ns: nw.Node}, err
			}); err != nil {
				t.Fatal(err)
			}
			out := nw.Node.MustExec(t, "nft", "list", "tables")
			if strings.Contains(out, string(tc.nftFamily)+" kube-proxy") || !strings.Contains(out, string(tc.nftFamily)+" other") {
				t.Errorf("tables after cleanup, want other and not kube-proxy:\n%s", out)
			}
			nw.Node.MustExec(t, "nft", "delete", "table", string(tc.nftFamily), "other")
		})
	}
}

// nsInterface runs transactions inside a namespace.
type nsInterface struct {
	knftables.Interface
	ns *kerneltest.NS
}

func (n *nsInterface) Run(ctx context.Context, tx *knftables.Transaction) error {
	return n.ns.Do(func() error { return n.Interface.Run(ctx, tx) })
}

// newWriterNetwork is the kernel tests' network: a client and a node
// (10.1.0.0/24, fd01::/64), and pods pod-a and pod-b (.11 and .12) on the
// node's bridge (10.0.0.0/16, fd00:10::/64), serving on port 8080.
func newWriterNetwork(t *testing.T) *kerneltest.ProxyNetwork {
	return writertest.KernelNetwork(t)
}
