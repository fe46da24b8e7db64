package nftables_test

import (
	"net/netip"
	"path/filepath"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/testkit/golden"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/nftables/nftablestest"
	"github.com/proxykit/proxykit/proxy"
)

const node = writertest.Node

// baseNodeIP is the node's IPv4 address in the clusters of the tests.
const baseNodeIP = "192.168.0.10"

func baseConfig() nftables.WriterConfig {
	return nftables.WriterConfig{
		Family: v1.IPv4Protocol,
		Node:   proxy.NodeConfig{Name: node, ClusterCIDRs: []netip.Prefix{prefix("10.0.0.0/16")}},
	}
}

func local(ip string) ep  { return ep{IP: ip, Node: node} }
func remote(ip string) ep { return ep{IP: ip, Node: "node-b"} }

// goldenCase is one small cluster per behaviour.
type goldenCase struct {
	name   string
	family v1.IPFamily
	config func(*nftables.WriterConfig)
	setup  func(c *cluster)
}

// goldenCases are writertest's scenarios, which iptables' writer renders
// too, then this writer's own cases.
var goldenCases = append(scenarioCases(), []goldenCase{{
	name: "affinity",
	setup: func(c *cluster) {
		c.setService(makeService("ns", "sticky", "10.96.0.14", withAffinity(300)))
		c.setEndpoints("ns", "sticky", tcp8080, local("10.0.1.1"), remote("10.0.2.1"))
	},
}, {
	name: "masquerade-all-options",
	config: func(cfg *nftables.WriterConfig) {
		cfg.TableName = "other-proxy"
		cfg.Node.ClusterCIDRs = []netip.Prefix{netip.Prefix{}}
		cfg.Node.MasqueradeAll = true
		cfg.Node.MasqueradeBit = ptr.To(0)
		cfg.Node.NodePortAddresses = []netip.Prefix{prefix("192.168.0.0/24"), prefix("172.16.0.0/12")}
		cfg.ServiceCIDRs = []netip.Prefix{prefix("10.96.0.0/16")}
	},
	setup: func(c *cluster) {
		c.setService(makeService("ns", "web", "10.96.0.10", withNodePort(30080), withExternalLocal()))
		c.setEndpoints("ns", "web", tcp8080, local("10.0.1.1"), remote("10.0.2.1"))
	},
}, {
	name:   "ipv6",
	family: v1.IPv6Protocol,
	config: func(cfg *nftables.WriterConfig) {
		cfg.Family = v1.IPv6Protocol
		cfg.Node.ClusterCIDRs = []netip.Prefix{prefix("fd00:10::/64")}
	},
	setup: func(c *cluster) {
		svc := makeService("ns", "web", "fd00:96::10", withNodePort(30080), withLoadBalancer("fd00:113::5", "fd00:1::/64"), withAffinity(60))
		// Dual-stack: the IPv4 side is the other writer's business.
		svc.Spec.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"}
		c.setService(svc)
		c.setEndpoints("ns", "web", tcp8080, local("fd00:10::1"), remote("fd00:10::2"))
	},
}}...)

func scenarioCases() []goldenCase {
	var cases []goldenCase
	for _, sc := range writertest.Scenarios {
		cases = append(cases, goldenCase{name: sc.Name, setup: func(c *cluster) { sc.Setup(c.Cluster) }})
	}
	for _, ld := range writertest.LocalDetections {
		cases = append(cases, goldenCase{
			name:   ld.Name,
			family: ld.Family,
			config: func(cfg *nftables.WriterConfig) { cfg.Family, cfg.Node = ld.Family, ld.Node },
			setup: func(c *cluster) {
				c.PodCIDRs = ld.PodCIDRs
				ld.Setup(c.Cluster)
			},
		})
	}
	return cases
}

// goldenCluster builds tc's cluster, config and a synced Fake.
func (tc goldenCase) build(t *testing.T) (*cluster, nftables.WriterConfig) {
	family := tc.family
	if family == "" {
		family = v1.IPv4Protocol
	}
	cfg := baseConfig()
	if tc.config != nil {
		tc.config(&cfg)
	}
	c := newCluster(family, node)
	c.NodeIPs = []netip.Addr{addr(baseNodeIP), addr("fd00:1::10")}
	tc.setup(c)
	return c, cfg
}

// TestWriterFullSyncGolden renders one small cluster per behaviour and
// compares the Fake's state after the first (full) sync with a golden
// file; every transaction also passes CheckTransaction.
func TestWriterFullSyncGolden(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			c, cfg := tc.build(t)
			fake, w := newFake(t, cfg)
			res := syncFake(t, w, fake, c.input())
			if !res.Full {
				t.Fatal("first sync was not full")
			}
			golden.Check(t, filepath.Join("testdata", "writer", tc.name+".golden"), []byte(normalDump(fake)))

			traceEveryService(t, fake, cfg, c)

			// A second full sync of the same input changes nothing.
			before := normalDump(fake)
			w.RequestFullSync()
			syncFake(t, w, fake, c.input())
			if got := normalDump(fake); got != before {
				t.Errorf("a second full sync changed the table:\nbefore:\n%s\nafter:\n%s", before, got)
			}
		})
	}
}

// traceEveryService sends a packet to every service port's cluster IP,
// node port, external IPs and load-balancer VIPs, from a pod, from
// outside and from the node, and fails t if the tracer cannot follow one:
// it must understand every rule the writer writes.
func traceEveryService(t *testing.T, fake *knftables.Fake, cfg nftables.WriterConfig, c *cluster) {
	t.Helper()
	table := cfg.TableName
	if table == "" {
		table = nftables.DefaultTableName
	}
	nodeIPs := proxy.NodeIPsOf(cfg.Family, c.NodeIPs)
	tr := nftablestest.NewTracer(fake, nftFamily(cfg.Family), table, nodeIPs...)
	pod, outside := addr("10.0.9.9"), addr("198.51.100.9")
	if cfg.Family == v1.IPv6Protocol {
		pod, outside = addr("fd00:10::99"), addr("fd00:99::9")
	}
	for name, svc := range c.ServiceMap {
		type dst struct {
			ip   netip.Addr
			port int
		}
		dsts := []dst{{svc.ClusterIP(), svc.Port()}}
		for _, ip := range append(svc.ExternalIPs(), svc.LoadBalancerVIPs()...) {
			dsts = append(dsts, dst{ip, svc.Port()})
		}
		if np := svc.NodePort(); np != 0 {
			for _, ip := range nodeIPs {
				dsts = append(dsts, dst{ip, np})
			}
		}
		for _, d := range dsts {
			if d.ip.Is4() != (cfg.Family == v1.IPv4Protocol) {
				continue
			}
			for _, p := range []nftablestest.Packet{
				{Src: pod, Dst: d.ip, Protocol: svc.Protocol(), DstPort: d.port},
				{Src: outside, Dst: d.ip, Protocol: svc.Protocol(), DstPort: d.port},
				{Src: nodeIPs[0], Dst: d.ip, Protocol: svc.Protocol(), DstPort: d.port, Output: true},
			} {
				if outs, err := tr.Trace(p); err != nil || len(outs) == 0 {
					t.Errorf("%s: tracing %+v: %v, %v", name, p, outs, err)
				}
			}
		}
	}
}
