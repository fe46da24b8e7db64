package nftables_test

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/golden"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/nftables/nftablestest"
	"github.com/proxykit/proxykit/proxy"
)

// serviceCIDRCase is one family's cluster for the ServiceCIDR tests: a
// service with an endpoint, and addresses to send packets to.
type serviceCIDRCase struct {
	family v1.IPFamily
	config func() nftables.WriterConfig
	// clusterIP is the service's; it serves port 80.
	clusterIP, client string
	// before and after are two sets of ranges (nested and of the other
	// family among them); inBoth, onlyBefore, onlyAfter and outside are
	// unallocated addresses.
	before, after                             []netip.Prefix
	inBoth, onlyBefore, onlyAfter, outsideAll string
}

var serviceCIDRCases = []serviceCIDRCase{{
	family:    v1.IPv4Protocol,
	config:    baseConfig,
	clusterIP: "10.96.0.10", client: "10.0.1.9",
	// 10.96.128.0/20 nests in 10.96.0.0/16, as a ServiceCIDR object of an
	// old range does in a new wider one; the IPv6 prefix is the other
	// writer's.
	before:     []netip.Prefix{prefix("10.96.128.0/20"), prefix("10.96.0.0/16"), prefix("fd00:96::/112"), prefix("10.100.0.0/16")},
	after:      []netip.Prefix{prefix("10.96.0.0/16"), prefix("10.97.0.0/16")},
	inBoth:     "10.96.200.1",
	onlyBefore: "10.100.0.5", onlyAfter: "10.97.0.5", outsideAll: "10.98.0.1",
}, {
	family: v1.IPv6Protocol,
	config: func() nftables.WriterConfig {
		return nftables.WriterConfig{
			Family: v1.IPv6Protocol,
			Node:   proxy.NodeConfig{Name: node, ClusterCIDRs: []netip.Prefix{prefix("fd00:10::/64")}},
		}
	},
	clusterIP: "fd00:96::10", client: "fd00:10::9",
	before:     []netip.Prefix{prefix("fd00:96::/112"), prefix("fd00:96::/108"), prefix("10.96.0.0/16")},
	after:      []netip.Prefix{prefix("fd00:96::/108"), prefix("fd00:97::/112")},
	inBoth:     "fd00:96::f:1",
	onlyBefore: "", onlyAfter: "fd00:97::5", outsideAll: "fd00:98::1",
}}

// nodeIP is the node's address of tc's family.
func (tc serviceCIDRCase) nodeIP() netip.Addr {
	if tc.family == v1.IPv6Protocol {
		return addr("fd00:1::10")
	}
	return addr(baseNodeIP)
}

func (tc serviceCIDRCase) cluster() *cluster {
	c := newCluster(tc.family, node)
	c.NodeIPs = []netip.Addr{tc.nodeIP()}
	c.setService(makeService("ns", "web", tc.clusterIP))
	ep := "10.0.1.1"
	if tc.family == v1.IPv6Protocol {
		ep = "fd00:10::1"
	}
	c.setEndpoints("ns", "web", tcp8080, local(ep))
	return c
}

func (tc serviceCIDRCase) trace(t *testing.T, tr *nftablestest.Tracer, dst string, port int) []outcome {
	t.Helper()
	outs, err := tr.Trace(nftablestest.Packet{Src: addr(tc.client), Dst: addr(dst), Protocol: v1.ProtocolTCP, DstPort: port})
	if err != nil {
		t.Fatal(err)
	}
	return outcomesOf(outs)
}

// TestWriterServiceCIDRs checks, in both families, the rules a sync's
// service CIDRs give (golden), what packets meet (tracer), and that a
// change of ranges is a full sync whose result is what a fresh writer's
// sync of the new ranges writes.
func TestWriterServiceCIDRs(t *testing.T) {
	for _, tc := range serviceCIDRCases {
		t.Run(string(tc.family), func(t *testing.T) {
			c := tc.cluster()
			fake, w := newFake(t, tc.config())
			in := c.input()
			in.ServiceCIDRs = tc.before
			syncFake(t, w, fake, in)
			golden.Check(t, filepath.Join("testdata", "writer", "service-cidrs-"+strings.ToLower(string(tc.family))+".golden"), []byte(normalDump(fake)))
			tr := nftablestest.NewTracer(fake, nftFamily(tc.family), nftables.DefaultTableName, tc.nodeIP())

			ep := "10.0.1.1:8080"
			if tc.family == v1.IPv6Protocol {
				ep = "[fd00:10::1]:8080"
			}
			check := func(name, dst string, port int, want []outcome) {
				t.Helper()
				if dst == "" {
					return
				}
				if diff := cmp.Diff(want, tc.trace(t, tr, dst, port)); diff != "" {
					t.Errorf("%s (%s:%d), outcomes (-want +got):\n%s", name, dst, port, diff)
				}
			}
			check("the service", tc.clusterIP, 80, []outcome{dnat(ep, false)})
			check("the service's cluster IP, a port it lacks", tc.clusterIP, 81, rejected)
			check("unallocated, in a nested range", tc.inBoth, 80, dropped)
			check("unallocated, in the first ranges only", tc.onlyBefore, 80, dropped)
			check("outside the first ranges", tc.onlyAfter, 80, accepted)
			check("outside every range", tc.outsideAll, 80, accepted)

			// The same ranges in another order, or merged otherwise:
			// nothing to do.
			in = c.input()
			in.ServiceCIDRs = append([]netip.Prefix{tc.before[len(tc.before)-1]}, tc.before...)
			if res := syncFake(t, w, fake, in); res.Full || res.Transaction.NumOperations() != 0 {
				t.Errorf("same ranges again: full=%v, transaction:\n%s", res.Full, res.Transaction)
			}

			in = c.input()
			in.ServiceCIDRs = tc.after
			res := syncFake(t, w, fake, in)
			// Ports are judged again against the new ranges.
			if !res.Full {
				t.Fatalf("a change of service CIDRs made a partial sync")
			}
			check("the service, after", tc.clusterIP, 80, []outcome{dnat(ep, false)})
			check("a port it lacks, after", tc.clusterIP, 81, rejected)
			check("unallocated in both", tc.inBoth, 80, dropped)
			check("in the first ranges only, after", tc.onlyBefore, 80, accepted)
			check("in the new range", tc.onlyAfter, 80, dropped)
			check("outside every range, after", tc.outsideAll, 80, accepted)

			freshFake, fresh := newFake(t, tc.config())
			in = tc.cluster().input()
			in.ServiceCIDRs = tc.after
			syncFake(t, fresh, freshFake, in)
			if diff := cmp.Diff(layoutDump(freshFake), layoutDump(fake)); diff != "" {
				t.Errorf("table after the change differs from a fresh writer's (-fresh +changed):\n%s", diff)
			}

			// No ranges: WriterConfig's (none here), so only the
			// reject of a cluster IP's missing port stays.
			in = c.input()
			res = syncFake(t, w, fake, in)
			if !res.Full {
				t.Fatalf("dropping the service CIDRs made a partial sync")
			}
			check("unallocated, no ranges", tc.inBoth, 80, accepted)
			check("a port it lacks, no ranges", tc.clusterIP, 81, rejected)
		})
	}
}

// TestWriterServiceCIDRsDefault checks that WriterConfig.ServiceCIDRs
// apply when the input has none, and that the input's replace them.
func TestWriterServiceCIDRsDefault(t *testing.T) {
	cfg := baseConfig()
	cfg.ServiceCIDRs = []netip.Prefix{prefix("10.96.0.0/16")}
	c := serviceCIDRCases[0].cluster()
	fake, w := newFake(t, cfg)
	syncFake(t, w, fake, c.input())
	rules := func() []string {
		var out []string
		for _, l := range strings.Split(fake.Dump(), "\n") {
			if strings.HasPrefix(l, "add rule ip kube-proxy cluster-ips-check ") {
				out = append(out, strings.TrimPrefix(l, "add rule ip kube-proxy cluster-ips-check "))
			}
		}
		return out
	}
	if diff := cmp.Diff([]string{"ip daddr @cluster-ips reject", "ip daddr { 10.96.0.0/16 } drop"}, rules()); diff != "" {
		t.Errorf("configured ranges (-want +got):\n%s", diff)
	}
	in := c.input()
	in.ServiceCIDRs = []netip.Prefix{prefix("10.97.0.0/16"), prefix("10.96.0.0/12")}
	syncFake(t, w, fake, in)
	if diff := cmp.Diff([]string{"ip daddr @cluster-ips reject", "ip daddr { 10.96.0.0/12 } drop"}, rules()); diff != "" {
		t.Errorf("the input's ranges, merged (-want +got):\n%s", diff)
	}
	syncFake(t, w, fake, c.input())
	if diff := cmp.Diff([]string{"ip daddr @cluster-ips reject", "ip daddr { 10.96.0.0/16 } drop"}, rules()); diff != "" {
		t.Errorf("back to the configured ranges (-want +got):\n%s", diff)
	}
}
