package nftables_test

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/nftables/nftablestest"
)

// outcome is a trace outcome without the chains, for comparison.
type outcome struct {
	Verdict    nftablestest.Verdict
	DNAT       string
	Masquerade bool
}

// outcomesOf returns the tracer's outcomes without their chains.
func outcomesOf(outs []nftablestest.Outcome) []outcome {
	var got []outcome
	for _, o := range outs {
		g := outcome{Verdict: o.Verdict, Masquerade: o.Masquerade}
		if o.DNAT.IsValid() {
			g.DNAT = o.DNAT.String()
		}
		got = append(got, g)
	}
	return got
}

func dnat(ap string, masq bool) outcome {
	return outcome{Verdict: nftablestest.Accept, DNAT: ap, Masquerade: masq}
}

var (
	rejected = []outcome{{Verdict: nftablestest.Reject}}
	dropped  = []outcome{{Verdict: nftablestest.Drop}}
	accepted = []outcome{{Verdict: nftablestest.Accept}}
)

// TestWriterTrace sends packets through the rules of one cluster, in the
// Fake, with the tracer, and checks where each goes.
func TestWriterTrace(t *testing.T) {
	const (
		nodeIP   = "192.168.0.10"
		podA     = "10.0.1.1" // on this node
		podB     = "10.0.2.1" // elsewhere
		outside  = "198.51.100.7"
		stranger = "203.0.113.99"
	)
	c := newCluster(v1.IPv4Protocol, node)
	c.setService(makeService("ns", "web", "10.96.0.10", withNodePort(30080), withExternalIPs("192.0.2.10")))
	c.setEndpoints("ns", "web", tcp8080, local(podA), remote(podB))
	c.setService(makeService("ns", "lb", "10.96.0.11", withLoadBalancer("203.0.113.5", "198.51.100.0/24"), withNodePort(30081)))
	c.setEndpoints("ns", "lb", tcp8080, remote(podB))
	c.setService(makeService("ns", "local", "10.96.0.12", withLoadBalancer("203.0.113.6"), withNodePort(30082), withExternalLocal()))
	c.setEndpoints("ns", "local", tcp8080, local(podA), remote(podB))
	c.setService(makeService("ns", "remote", "10.96.0.13", withNodePort(30083), withExternalLocal()))
	c.setEndpoints("ns", "remote", tcp8080, remote(podB))
	c.setService(makeService("ns", "sticky", "10.96.0.14", withAffinity(60)))
	c.setEndpoints("ns", "sticky", tcp8080, local(podA))
	c.setService(makeService("ns", "empty", "10.96.0.15", withNodePort(30085)))
	c.setService(makeService("ns", "remote-ext", "10.96.0.16", withExternalIPs("192.0.2.16"), withLoadBalancer("203.0.113.16"), withExternalLocal()))
	c.setEndpoints("ns", "remote-ext", tcp8080, remote(podB))
	c.setService(makeService("ns", "fenced-empty", "10.96.0.17", withLoadBalancer("203.0.113.17", "198.51.100.0/24")))
	cfg := baseConfig()
	cfg.ServiceCIDRs = []netip.Prefix{prefix("10.96.0.0/16")}
	fake, w := newFake(t, cfg)
	syncFake(t, w, fake, c.input())
	tr := nftablestest.NewTracer(fake, knftables.IPv4Family, nftables.DefaultTableName, addr(nodeIP))

	tcp := func(src, dst string, port int) nftablestest.Packet {
		return nftablestest.Packet{Src: addr(src), Dst: addr(dst), Protocol: v1.ProtocolTCP, DstPort: port}
	}
	fromNode := func(dst string, port int) nftablestest.Packet {
		p := tcp(nodeIP, dst, port)
		p.Output = true
		return p
	}
	for _, tc := range []struct {
		name string
		p    nftablestest.Packet
		want []outcome
	}{
		{"cluster IP from a pod", tcp("10.0.1.9", "10.96.0.10", 80), []outcome{dnat(podA+":8080", false), dnat(podB+":8080", false)}},
		{"cluster IP from outside the cluster", tcp(outside, "10.96.0.10", 80), []outcome{dnat(podA+":8080", true), dnat(podB+":8080", true)}},
		{"cluster IP from the node", fromNode("10.96.0.10", 80), []outcome{dnat(podA+":8080", true), dnat(podB+":8080", true)}},
		{"hairpin: the other pod keeps its address, this one is masqueraded", tcp(podA, "10.96.0.10", 80), []outcome{dnat(podA+":8080", true), dnat(podB+":8080", false)}},
		{"cluster IP, wrong port", tcp(podA, "10.96.0.10", 81), rejected},
		{"cluster IP, wrong protocol", nftablestest.Packet{Src: addr(podA), Dst: addr("10.96.0.10"), Protocol: v1.ProtocolUDP, DstPort: 80}, rejected},
		{"unallocated cluster IP", tcp(podA, "10.96.9.9", 80), dropped},
		{"node port", tcp(outside, nodeIP, 30080), []outcome{dnat(podA+":8080", true), dnat(podB+":8080", true)}},
		{"node port not in use", tcp(outside, nodeIP, 30099), accepted},
		{"external IP", tcp(outside, "192.0.2.10", 80), []outcome{dnat(podA+":8080", true), dnat(podB+":8080", true)}},
		{"load balancer, allowed source", tcp(outside, "203.0.113.5", 80), []outcome{dnat(podB+":8080", true)}},
		{"load balancer, other source", tcp(stranger, "203.0.113.5", 80), dropped},
		{"node port of a source-restricted LB is open", tcp(stranger, nodeIP, 30081), []outcome{dnat(podB+":8080", true)}},
		{"Local LB from outside keeps the client", tcp(outside, "203.0.113.6", 80), []outcome{dnat(podA+":8080", false)}},
		{"Local LB from a pod goes to all endpoints", tcp(podB, "203.0.113.6", 80), []outcome{dnat(podA+":8080", false), dnat(podB+":8080", true)}},
		{"Local node port without local endpoints", tcp(outside, nodeIP, 30083), dropped},
		{"Local service's cluster IP uses all endpoints", tcp(podA, "10.96.0.13", 80), []outcome{dnat(podB+":8080", false)}},
		{"affinity, first packet", tcp(podB, "10.96.0.14", 80), []outcome{dnat(podA+":8080", false)}},
		{"no endpoints: cluster IP", tcp(podA, "10.96.0.15", 80), rejected},
		{"no endpoints: node port", tcp(outside, nodeIP, 30085), rejected},
		{"no endpoints: from the node", fromNode("10.96.0.15", 80), rejected},
		// The node's packets to its own address come back in over
		// loopback, through filter-input's node-port checks.
		{"no endpoints: node port, from the node", fromNode(nodeIP, 30085), rejected},
		{"Local node port without local endpoints, from the node", fromNode(nodeIP, 30083), []outcome{dnat(podB+":8080", true)}},
		{"node port, from the node", fromNode(nodeIP, 30080), []outcome{dnat(podA+":8080", true), dnat(podB+":8080", true)}},
		{"node port not in use, from the node", fromNode(nodeIP, 30099), accepted},
		// The node's own connections to the external addresses of a
		// Local service without a local endpoint are short-circuited to
		// all endpoints, as from a pod; the endpoints check runs after
		// nat-output and does not see the service's address any more.
		{"Local external IP without local endpoints, from outside", tcp(outside, "192.0.2.16", 80), dropped},
		{"Local external IP without local endpoints, from the node", fromNode("192.0.2.16", 80), []outcome{dnat(podB+":8080", true)}},
		{"Local LB without local endpoints, from outside", tcp(outside, "203.0.113.16", 80), dropped},
		{"Local LB without local endpoints, from the node", fromNode("203.0.113.16", 80), []outcome{dnat(podB+":8080", true)}},
		// The firewall runs before the endpoints check: a source outside
		// the ranges is dropped even when the service has no endpoints.
		{"LB without endpoints, source outside its ranges, from the node", fromNode("203.0.113.17", 80), dropped},
		{"LB without endpoints, source outside its ranges", tcp(stranger, "203.0.113.17", 80), dropped},
		{"LB without endpoints, source inside its ranges", tcp(outside, "203.0.113.17", 80), rejected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outs, err := tr.Trace(tc.p)
			if err != nil {
				t.Fatal(err)
			}
			got := outcomesOf(outs)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("outcomes (-want +got):\n%s\nchains: %v", diff, outs)
			}
		})
	}
}
