package nftables_test

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/nftables/nftablestest"
	"github.com/proxykit/proxykit/proxy"
)

// TestTracerNodeLocalDeliveryKernel checks that the tracer and the real
// kernel agree on the node's own connections to its own addresses, which
// the kernel sends out through output and postrouting and back in over
// loopback through prerouting and input. The same writer input goes to a
// knftables.Fake, traced, and to nft in a node namespace, where the node
// connects:
//
//   - a node port without endpoints: rejected by filter-input's
//     no-endpoints check, which only the way back in reaches;
//   - a node port with an endpoint: DNATed in nat-output to the pod;
//   - a cluster IP whose endpoint is the node itself, on a port that is
//     another service's node port: delivered to the node's own listener,
//     not DNATed a second time on the way back in (the kernel sets a
//     connection's NAT up once).
func TestTracerNodeLocalDeliveryKernel(t *testing.T) {
	kerneltest.Require(t, "nft")
	nw := newWriterNetwork(t)
	kerneltest.StartBackend(t, nw.Node, "node", 30090)
	for _, tc := range []struct {
		family                  v1.IPFamily
		nftFamily               knftables.Family
		nodeIP, bridgeIP, cidr  string
		podA, podB              string
		npSvc, emptySvc, hostSv string // cluster IPs
		otherSvc                string
	}{
		{v1.IPv4Protocol, knftables.IPv4Family, "10.1.0.1", "10.0.0.1", "10.0.0.0/16", "10.0.0.11", "10.0.0.12",
			"10.96.0.50", "10.96.0.51", "10.96.0.52", "10.96.0.53"},
		{v1.IPv6Protocol, knftables.IPv6Family, "fd01::1", "fd00:10::1", "fd00:10::/64", "fd00:10::11", "fd00:10::12",
			"fd00:96::50", "fd00:96::51", "fd00:96::52", "fd00:96::53"},
	} {
		t.Run(string(tc.family), func(t *testing.T) {
			cfg := nftables.WriterConfig{
				Family: tc.family,
				Node:   proxy.NodeConfig{Name: "node-a", ClusterCIDRs: []netip.Prefix{prefix(tc.cidr)}},
			}
			nft := nsNFT(t, nw.Node, tc.nftFamily)
			w, err := nftables.NewWriter(nft, cfg)
			if err != nil {
				t.Fatal(err)
			}
			fake, fw := newFake(t, cfg)

			c := newCluster(tc.family, "node-a")

			c.NodeIPs = []netip.Addr{addr(tc.nodeIP)}
			c.setService(makeService("ns", "np", tc.npSvc, withNodePort(30080)))
			c.setEndpoints("ns", "np", tcp8080, local(tc.podA))
			c.setService(makeService("ns", "empty", tc.emptySvc, withNodePort(30085)))
			c.setService(makeService("ns", "host", tc.hostSv))
			c.setEndpoints("ns", "host", []discoveryv1.EndpointPort{slicePort("p", 30090, v1.ProtocolTCP)}, ep{IP: tc.nodeIP, Node: "node-a"})
			c.setService(makeService("ns", "other", tc.otherSvc, withNodePort(30090)))
			c.setEndpoints("ns", "other", tcp8080, local(tc.podB))
			in := c.input()
			applyIn(t, nw.Node, nft, w, in, true)
			syncFake(t, fw, fake, in)

			tr := nftablestest.NewTracer(fake, tc.nftFamily, nftables.DefaultTableName, addr(tc.nodeIP), addr(tc.bridgeIP))
			backends := map[netip.Addr]string{addr(tc.podA): "pod-a", addr(tc.podB): "pod-b", addr(tc.nodeIP): "node"}
			for _, x := range []struct {
				name string
				dst  netip.AddrPort
				want string // a backend's name, or "reject"
			}{
				{"node port without endpoints", netip.AddrPortFrom(addr(tc.nodeIP), 30085), "reject"},
				{"node port", netip.AddrPortFrom(addr(tc.nodeIP), 30080), "pod-a"},
				{"cluster IP served by the node, on another node port", netip.AddrPortFrom(addr(tc.hostSv), 80), "node"},
			} {
				outs, err := tr.Trace(nftablestest.Packet{Src: addr(tc.nodeIP), Dst: x.dst.Addr(), Protocol: v1.ProtocolTCP, DstPort: int(x.dst.Port()), Output: true})
				if err != nil {
					t.Fatal(err)
				}
				traced := "?"
				switch {
				case len(outs) != 1:
				case outs[0].Verdict == nftablestest.Reject:
					traced = "reject"
				case outs[0].Verdict == nftablestest.Accept && outs[0].DNAT.IsValid():
					traced = backends[outs[0].DNAT.Addr()]
				}
				r, err := kerneltest.DialFrom(nw.Node, "tcp", addr(tc.nodeIP), x.dst, 3*time.Second)
				kernel := r.Name
				switch {
				case errors.Is(err, syscall.ECONNREFUSED):
					kernel = "reject"
				case err != nil:
					kernel = err.Error()
				}
				if traced != x.want || kernel != x.want {
					t.Errorf("%s (%s) from the node: traced %q (%+v), kernel %q; want %q from both", x.name, x.dst, traced, outs, kernel, x.want)
				}
			}
		})
	}
}
