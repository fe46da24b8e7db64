package iptables_test

import (
	"math"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/proxy"
)

// traceNode runs the scenarios of the kernel tests against the Fake's
// packet trace: the same cluster, the same changes, the same expectations
// about where packets go.
type traceNode struct {
	w *iptables.Writer
	f *iptablestest.Fake
	c *cluster
}

// packet is the first packet of a connection from src to dst:port,
// arriving from the network.
func scnPacket(proto, src, dst string, port int) iptablestest.Packet {
	return iptablestest.Packet{
		Protocol:        proto,
		Source:          addr(src),
		Destination:     addr(dst),
		SourcePort:      40000,
		DestinationPort: uint16(port),
		InInterface:     "eth0",
		NodeAddrs:       []netip.Addr{addr(scnNodeIP), addr(scnBridgeIP)},
		Recent:          map[string]bool{},
	}
}

// result is where a traced packet can end up: "ip:port" of the endpoint
// (after DNAT) with its probability, or "DROP", "REJECT", "local" (to the
// node itself, not DNATed) or "forward" (on its way elsewhere, not
// DNATed). masq says whether every DNATed outcome is masqueraded.
type result struct {
	to   map[string]float64
	masq bool
}

func (n *traceNode) trace(t *testing.T, p iptablestest.Packet) result {
	t.Helper()
	outs, err := n.f.Trace(p)
	if err != nil {
		t.Fatalf("trace of %+v: %v", p, err)
	}
	r := result{to: map[string]float64{}, masq: true}
	dnat := false
	for _, o := range outs {
		var key string
		switch {
		case o.Verdict != iptablestest.Accept:
			key = string(o.Verdict)
		case o.DNAT:
			dnat = true
			key = netip.AddrPortFrom(o.Destination, o.DestinationPort).String()
			r.masq = r.masq && o.Masquerade
		case o.Local:
			key = "local"
		default:
			key = "forward"
		}
		r.to[key] += o.Probability
	}
	r.masq = r.masq && dnat
	for k, v := range r.to {
		r.to[k] = math.Round(v*1000) / 1000
	}
	return r
}

func (n *traceNode) expect(t *testing.T, what string, p iptablestest.Packet, want result) {
	t.Helper()
	got := n.trace(t, p)
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(result{})); diff != "" {
		t.Errorf("%s: %s %s:%d -> %s:%d (-want +got):\n%s", what, p.Protocol, p.Source, p.SourcePort, p.Destination, p.DestinationPort, diff)
	}
}

func ep8080(ip string) string { return ip + ":8080" }

func TestWriterTrace(t *testing.T) {
	n := &traceNode{w: mustWriter(t, scnWriterConfig(true)), f: iptablestest.NewFake(), c: scnCluster()}
	syncFake(t, n.w, n.f, n.c.input())
	balanced := result{to: map[string]float64{ep8080(scnPodA): 0.5, ep8080(scnPodB): 0.5}, masq: true}
	onlyA := result{to: map[string]float64{ep8080(scnPodA): 1}, masq: true}

	t.Run("1 cluster IP TCP and UDP", func(t *testing.T) {
		n.expect(t, "tcp", scnPacket("tcp", scnClientIP, scnWebIP, 80), balanced)
		n.expect(t, "udp", scnPacket("udp", scnClientIP, scnWebIP, 80), balanced)
		// From a pod, no masquerading.
		n.expect(t, "from a pod", scnPacket("tcp", scnPodC, scnWebIP, 80),
			result{to: map[string]float64{ep8080(scnPodA): 0.5, ep8080(scnPodB): 0.5}})
	})

	t.Run("2 node port, external IP, load balancer", func(t *testing.T) {
		n.expect(t, "node port", scnPacket("tcp", scnClientIP, scnNodeIP, scnNodePort), balanced)
		n.expect(t, "node port on the bridge address", scnPacket("tcp", scnClientIP, scnBridgeIP, scnNodePort), balanced)
		n.expect(t, "external IP", scnPacket("tcp", scnClientIP, scnExternalIP, 80), balanced)
		n.expect(t, "LB from an allowed source", scnPacket("tcp", scnClientIP, scnLBVIP, 80), balanced)
		n.expect(t, "LB from another source", scnPacket("tcp", scnOtherClient, scnLBVIP, 80), result{to: map[string]float64{"DROP": 1}})
		n.expect(t, "cluster IP of the LB from another source", scnPacket("tcp", scnOtherClient, scnLBIP, 80), balanced)
	})

	t.Run("3 ClientIP affinity", func(t *testing.T) {
		sticky := portName(scnNS, "sticky", "p", v1.ProtocolTCP)
		sepB := string(kubeChains.Endpoint(sticky, ep8080(scnPodB)))
		p := scnPacket("tcp", scnClientIP, scnStickyIP, 80)
		n.expect(t, "first connection", p, balanced)
		outs, err := n.f.Trace(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range outs {
			want := string(kubeChains.Endpoint(sticky, netip.AddrPortFrom(o.Destination, o.DestinationPort).String()))
			if len(o.RecentSet) != 1 || o.RecentSet[0] != want {
				t.Errorf("connection to %s:%d recorded the client in %v, want [%s]", o.Destination, o.DestinationPort, o.RecentSet, want)
			}
		}
		// A client already in pod-b's list goes to pod-b.
		p.Recent = map[string]bool{sepB: true}
		n.expect(t, "client remembered for pod-b", p, result{to: map[string]float64{ep8080(scnPodB): 1}, masq: true})
	})

	t.Run("4 no endpoints", func(t *testing.T) {
		rejected := result{to: map[string]float64{"REJECT": 1}}
		n.expect(t, "tcp", scnPacket("tcp", scnClientIP, scnEmptyIP, 80), rejected)
		n.expect(t, "udp", scnPacket("udp", scnClientIP, scnEmptyIP, 80), rejected)
		n.expect(t, "node port", scnPacket("tcp", scnClientIP, scnNodeIP, scnEmptyNodePort), rejected)
	})

	t.Run("5 externalTrafficPolicy Local", func(t *testing.T) {
		preserved := result{to: map[string]float64{ep8080(scnPodA): 1}}
		n.expect(t, "node port", scnPacket("tcp", scnClientIP, scnNodeIP, scnLocalNodePort), preserved)
		n.expect(t, "VIP", scnPacket("tcp", scnClientIP, scnLocalVIP, 80), preserved)
		n.expect(t, "health check", scnPacket("tcp", scnClientIP, scnNodeIP, scnLocalHCPort), result{to: map[string]float64{"local": 1}})
		n.expect(t, "cluster IP", scnPacket("tcp", scnClientIP, scnLocalIP, 80), balanced)
		// Pods reaching the external address are not limited to local
		// endpoints.
		n.expect(t, "VIP from a pod", scnPacket("tcp", scnPodC, scnLocalVIP, 80),
			result{to: map[string]float64{ep8080(scnPodA): 0.5, ep8080(scnPodB): 0.5}})
		n.expect(t, "no local endpoint: node port", scnPacket("tcp", scnClientIP, scnNodeIP, scnRemoteNodePort), result{to: map[string]float64{"DROP": 1}})
		n.expect(t, "no local endpoint: cluster IP", scnPacket("tcp", scnClientIP, scnRemoteIP, 80),
			result{to: map[string]float64{ep8080(scnPodB): 1}, masq: true})
	})

	t.Run("KUBE-FORWARD", func(t *testing.T) {
		// With a FORWARD policy of DROP, service traffic still gets
		// through: KUBE-FORWARD accepts what KUBE-MARK-MASQ marked, and
		// the rest of its connection. Whatever the policy, it drops
		// conntrack INVALID packets.
		strict := iptablestest.NewFake()
		dump := strings.Replace(n.f.Dump(), ":FORWARD ACCEPT", ":FORWARD DROP", 1)
		if err := strict.ParseDump(dump); err != nil {
			t.Fatal(err)
		}
		s := &traceNode{f: strict}
		s.expect(t, "new connection", scnPacket("tcp", scnClientIP, scnWebIP, 80), balanced)
		later := scnPacket("tcp", scnClientIP, scnPodA, scnPort)
		later.CTState = "ESTABLISHED"
		s.expect(t, "established", later, result{to: map[string]float64{"forward": 1}})
		invalid := scnPacket("tcp", scnClientIP, scnWebIP, 80)
		invalid.CTState = "INVALID"
		n.expect(t, "invalid, FORWARD policy ACCEPT", invalid, result{to: map[string]float64{"DROP": 1}})
		unmarked := scnPacket("tcp", scnClientIP, scnPodA, scnPort)
		s.expect(t, "not service traffic", unmarked, result{to: map[string]float64{"DROP": 1}})
	})

	t.Run("hairpin", func(t *testing.T) {
		p := scnPacket("tcp", scnPodA, scnHairpinIP, 80)
		p.InInterface = "br0"
		n.expect(t, "pod to itself", p, onlyA)
	})

	t.Run("6 partial syncs", func(t *testing.T) {
		scnRemoveEndpoint(n.c)
		syncFake(t, n.w, n.f, n.c.input())
		n.expect(t, "endpoint removed", scnPacket("tcp", scnClientIP, scnWebIP, 80), onlyA)
		scnAddService(n.c)
		syncFake(t, n.w, n.f, n.c.input())
		n.expect(t, "service added", scnPacket("tcp", scnClientIP, scnAddedIP, 80), result{to: map[string]float64{ep8080(scnPodC): 1}, masq: true})
		scnDeleteService(n.c)
		syncFake(t, n.w, n.f, n.c.input())
		n.expect(t, "service deleted: node port", scnPacket("tcp", scnClientIP, scnNodeIP, scnNodePort), result{to: map[string]float64{"local": 1}})
		n.expect(t, "service deleted: cluster IP", scnPacket("tcp", scnClientIP, scnNPIP, 80), result{to: map[string]float64{"forward": 1}})
	})

	t.Run("7 failed restore", func(t *testing.T) {
		scnAddLate(n.c)
		res := n.w.Sync(t.Context(), n.c.input())
		res.Payload = scnBreak(res.Payload)
		err := applyFake(n.f, n.w, res)
		if err == nil {
			t.Fatal("the Fake accepted a jump to a missing chain")
		}
		n.w.Applied(err)
		n.expect(t, "old rules", scnPacket("tcp", scnClientIP, scnWebIP, 80), onlyA)
		n.expect(t, "new service not there", scnPacket("tcp", scnClientIP, scnLateIP, 80), result{to: map[string]float64{"forward": 1}})
		if res := syncFake(t, n.w, n.f, n.c.input()); !res.Full {
			t.Error("sync after the failure is not full")
		}
		n.expect(t, "new service after the full sync", scnPacket("tcp", scnClientIP, scnLateIP, 80), result{to: map[string]float64{ep8080(scnPodD): 1}, masq: true})
	})
}

// TestWriterTraceIPv6 checks an IPv6 writer's rules with the trace.
func TestWriterTraceIPv6(t *testing.T) {
	c := newCluster(v1.IPv6Protocol, "node-a")
	c.setService(makeService("ns", "web", "fd00:96::10", withNodePort(30080)))
	c.setEndpoints("ns", "web", tcp8080, ep{IP: "fd00:10::1", Node: "node-a"}, ep{IP: "fd00:10::2", Node: "node-b"})
	c.setService(makeService("ns", "empty", "fd00:96::11"))
	n := &traceNode{
		w: mustWriter(t, iptables.WriterConfig{Family: v1.IPv6Protocol, Node: proxy.NodeConfig{Name: "node-a", ClusterCIDRs: []netip.Prefix{prefix("fd00:10::/64")}}}),
		f: iptablestest.NewIPv6Fake(),
		c: c,
	}
	syncFake(t, n.w, n.f, c.input())
	pkt := func(dst string, port int) iptablestest.Packet {
		return iptablestest.Packet{Protocol: "tcp", Source: addr("fd00:1::2"), Destination: addr(dst), SourcePort: 40000,
			DestinationPort: uint16(port), InInterface: "eth0", NodeAddrs: []netip.Addr{addr("fd00:1::1")}}
	}
	balanced := result{to: map[string]float64{"[fd00:10::1]:8080": 0.5, "[fd00:10::2]:8080": 0.5}, masq: true}
	n.expect(t, "cluster IP", pkt("fd00:96::10", 80), balanced)
	n.expect(t, "node port", pkt("fd00:1::1", 30080), balanced)
	n.expect(t, "no endpoints", pkt("fd00:96::11", 80), result{to: map[string]float64{"REJECT": 1}})
	n.expect(t, "loopback node port", pkt("::1", 30080), result{to: map[string]float64{"local": 1}})
}
