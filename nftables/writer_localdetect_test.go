package nftables_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/nftables/nftablestest"
	"github.com/proxykit/proxykit/proxy"
)

// TestWriterTraceLocalDetection traces packets through the rules of each
// local-detection mode: traffic to a cluster IP is masqueraded unless it
// is local by the mode's measure (source in the pod range, or in through
// the bridge or an interface with the prefix), and local traffic to the
// VIP of an externalTrafficPolicy Local service goes to every endpoint
// rather than to the local ones alone.
func TestWriterTraceLocalDetection(t *testing.T) {
	const (
		podA   = "10.0.1.1" // on this node
		podB   = "10.0.2.1" // elsewhere
		client = "10.0.1.9" // a pod of this node, the client
	)
	type packet struct {
		name     string
		src, iif string
	}
	for _, tc := range []struct {
		name     string
		node     proxy.NodeConfig
		podCIDRs []netip.Prefix
		local    []packet
		other    []packet
	}{{
		name:     "NodeCIDR",
		node:     proxy.NodeConfig{DetectLocalMode: proxy.LocalModeNodeCIDR, ClusterCIDRs: []netip.Prefix{prefix("10.0.0.0/16")}},
		podCIDRs: []netip.Prefix{prefix("10.0.1.0/24")},
		local:    []packet{{"a pod of the node", client, "cni0"}},
		other:    []packet{{"a pod of another node, in the cluster CIDR", "10.0.2.9", "eth0"}, {"outside", "198.51.100.7", "eth0"}},
	}, {
		name:  "BridgeInterface",
		node:  proxy.NodeConfig{DetectLocalMode: proxy.LocalModeBridgeInterface, BridgeInterface: "cni0"},
		local: []packet{{"through the bridge", client, "cni0"}, {"through the bridge from any source", "198.51.100.7", "cni0"}},
		other: []packet{{"a pod address through another interface", client, "eth0"}, {"through a longer name", client, "cni0x"}},
	}, {
		name:  "InterfaceNamePrefix",
		node:  proxy.NodeConfig{DetectLocalMode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: "veth"},
		local: []packet{{"through a veth", client, "veth1234"}, {"through the name itself", client, "veth"}},
		other: []packet{{"a pod address through another interface", client, "eth0"}, {"through a name that contains it later", client, "xveth1"}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(v1.IPv4Protocol, node)
			c.PodCIDRs = tc.podCIDRs
			c.setService(makeService("ns", "web", "10.96.0.10"))
			c.setEndpoints("ns", "web", tcp8080, local(podA), remote(podB))
			c.setService(makeService("ns", "lb", "10.96.0.11", withLoadBalancer("203.0.113.5"), withNodePort(31000), withExternalLocal()))
			c.setEndpoints("ns", "lb", tcp8080, local(podA), remote(podB))
			cfg := baseConfig()
			tc.node.Name = node
			cfg.Node = tc.node
			fake, w := newFake(t, cfg)
			syncFake(t, w, fake, c.input())
			tr := nftablestest.NewTracer(fake, knftables.IPv4Family, nftables.DefaultTableName, addr(baseNodeIP))
			trace := func(p packet, dst string) []outcome {
				t.Helper()
				outs, err := tr.Trace(nftablestest.Packet{Src: addr(p.src), Dst: addr(dst), Protocol: v1.ProtocolTCP, DstPort: 80, InInterface: p.iif})
				if err != nil {
					t.Fatalf("%s to %s: %v", p.name, dst, err)
				}
				return outcomesOf(outs)
			}
			check := func(p packet, dst string, want []outcome) {
				t.Helper()
				if diff := cmp.Diff(want, trace(p, dst)); diff != "" {
					t.Errorf("%s to %s (-want +got):\n%s", p.name, dst, diff)
				}
			}
			// A local client whose address is podA's would hairpin; the
			// client is another address.
			for _, p := range tc.local {
				check(p, "10.96.0.10", []outcome{dnat(podA+":8080", false), dnat(podB+":8080", false)})
				check(p, "203.0.113.5", []outcome{dnat(podA+":8080", false), dnat(podB+":8080", false)})
			}
			for _, p := range tc.other {
				check(p, "10.96.0.10", []outcome{dnat(podA+":8080", true), dnat(podB+":8080", true)})
				check(p, "203.0.113.5", []outcome{dnat(podA+":8080", false)})
			}
		})
	}
}

// TestWriterPodCIDRs checks that in NodeCIDR mode the node's pod range
// of a sync's input is what tells local traffic: none detects nothing (no
// masquerade rule for cluster IPs, no short-circuit of pod traffic), and a
// change rewrites every port's rules and the shared chains, in a full
// sync, as a fresh writer would; the pod ranges of the other family, and
// a change of them, do not matter.
func TestWriterPodCIDRs(t *testing.T) {
	cfg := baseConfig()
	cfg.Node.DetectLocalMode = proxy.LocalModeNodeCIDR
	c := newCluster(v1.IPv4Protocol, node)
	c.setService(makeService("ns", "web", "10.96.0.10"))
	c.setEndpoints("ns", "web", tcp8080, local("10.0.1.1"), remote("10.0.2.1"))
	c.setService(makeService("ns", "lb", "10.96.0.11", withLoadBalancer("203.0.113.5"), withNodePort(31000), withExternalLocal()))
	c.setEndpoints("ns", "lb", tcp8080, local("10.0.1.2"))
	fake, w := newFake(t, cfg)
	syncFake(t, w, fake, c.input())
	tr := nftablestest.NewTracer(fake, knftables.IPv4Family, nftables.DefaultTableName, addr(baseNodeIP))
	masqueraded := func(src string) bool {
		t.Helper()
		outs, err := tr.Trace(nftablestest.Packet{Src: addr(src), Dst: addr("10.96.0.10"), Protocol: v1.ProtocolTCP, DstPort: 80, InInterface: "eth0"})
		if err != nil {
			t.Fatal(err)
		}
		return outs[0].Masquerade
	}
	if masqueraded("198.51.100.7") || masqueraded("10.0.1.9") {
		t.Fatalf("without a pod CIDR, cluster-IP traffic is masqueraded:\n%s", normalDump(fake))
	}
	for _, step := range []struct {
		name     string
		podCIDRs []netip.Prefix
		wantFull bool
		// local is an address inside the pod range, other one outside.
		local, other string
	}{
		{"pod CIDR allocated", []netip.Prefix{prefix("fd00:10:0:1::/64"), prefix("10.0.1.0/24")}, true, "10.0.1.9", "10.0.7.9"},
		{"the other family's changed", []netip.Prefix{prefix("10.0.1.0/24"), prefix("fd00:10:0:2::/64")}, false, "10.0.1.9", "10.0.7.9"},
		{"pod CIDR changed", []netip.Prefix{prefix("10.0.7.0/24")}, true, "10.0.7.9", "10.0.1.9"},
	} {
		c.PodCIDRs = step.podCIDRs
		res := syncFake(t, w, fake, c.input())
		if res.Full != step.wantFull {
			t.Errorf("%s: sync full=%v, want %v", step.name, res.Full, step.wantFull)
		}
		if masqueraded(step.local) || !masqueraded(step.other) {
			t.Errorf("%s: from %s masqueraded %v (want false), from %s %v (want true)", step.name,
				step.local, masqueraded(step.local), step.other, masqueraded(step.other))
		}
		freshFake, fresh := newFake(t, cfg)
		syncFake(t, fresh, freshFake, c.input())
		if diff := cmp.Diff(normalDump(freshFake), normalDump(fake)); diff != "" {
			t.Errorf("%s: table differs from a fresh writer's (-fresh +got):\n%s", step.name, diff)
		}
	}
	c.PodCIDRs = nil
	if res := syncFake(t, w, fake, c.input()); !res.Full || masqueraded("198.51.100.7") {
		t.Errorf("pod CIDR gone: full=%v, masqueraded from outside %v; want a full sync without masquerading", res.Full, masqueraded("198.51.100.7"))
	}
}

// TestNewWriterRefusesBadLocalDetection checks that the local-detection
// settings that could not make a rule are refused with the field.
func TestNewWriterRefusesBadLocalDetection(t *testing.T) {
	for _, tc := range []struct {
		name string
		node proxy.NodeConfig
		want string
	}{
		{"unknown mode", proxy.NodeConfig{DetectLocalMode: "PodCIDR"}, `nftables writer: Node.DetectLocalMode "PodCIDR"`},
		{"bridge mode without a bridge", proxy.NodeConfig{DetectLocalMode: proxy.LocalModeBridgeInterface}, "nftables writer: Node.BridgeInterface: interface name must not be empty"},
		{"a quote in the bridge name", proxy.NodeConfig{DetectLocalMode: proxy.LocalModeBridgeInterface, BridgeInterface: `cni0" accept`}, "nftables writer: Node.BridgeInterface: interface name"},
		{"a wildcard in the prefix", proxy.NodeConfig{DetectLocalMode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: "veth*"}, "nftables writer: Node.InterfaceNamePrefix: interface name"},
		{"a prefix that leaves no room", proxy.NodeConfig{DetectLocalMode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: "abcdefghijklmno"}, "nftables writer: Node.InterfaceNamePrefix: interface name prefix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig()
			cfg.Node = tc.node
			_, err := nftables.NewWriter(knftables.NewFake(knftables.IPv4Family, nftables.DefaultTableName), cfg)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("got %v, want an error starting %q", err, tc.want)
			}
		})
	}
}
