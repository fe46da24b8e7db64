package nftmeasure

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/netlinkbuf"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
)

// benchEnv turns on TestTransportTimes, which loads 10,000-service
// rulesets (minutes): set it to 1 to measure.
const benchEnv = "PROXYKIT_NFT_BENCH"

// nftTable is a namespace with the generated table loaded through knftables,
// which execs `nft -f -` inside the namespace.
type nftTable struct {
	ns  *kerneltest.NS
	nft knftables.Interface
}

func newNFTTable(t testing.TB) *nftTable {
	t.Helper()
	ns := kerneltest.NewNS(t)
	var nft knftables.Interface
	// knftables.New execs `nft --version` and `nft --check`: inside the
	// namespace, like every later Run.
	if err := ns.Do(func() (err error) {
		nft, err = knftables.New(Family, Table)
		return err
	}); err != nil {
		t.Fatalf("knftables in %s: %v", ns.Name, err)
	}
	return &nftTable{ns: ns, nft: nft}
}

// execRun applies c as knftables' Run does (one `nft -f -`) and returns how
// long Run took.
func (n *nftTable) execRun(c Change) (time.Duration, error) {
	tx := n.nft.NewTransaction()
	if err := c.Transaction(tx); err != nil {
		return 0, err
	}
	var took time.Duration
	err := n.ns.Do(func() error {
		start := time.Now()
		err := n.nft.Run(context.Background(), tx)
		took = time.Since(start)
		return err
	})
	return took, err
}

// netlinkRun applies c as one netlink batch on a new connection to the
// namespace and returns how long it took, the dial included.
func (n *nftTable) netlinkRun(c Change) (time.Duration, error) {
	start := time.Now()
	conn, err := nftables.New(nftables.WithNetNSFd(int(n.ns.Handle())), nftables.WithSockOptions(bigBuffers))
	if err != nil {
		return 0, err
	}
	if err := Netlink(conn, c); err != nil {
		return 0, err
	}
	err = conn.Flush()
	return time.Since(start), err
}

// bigBuffers lets one netlink batch carry a whole table: google/nftables
// sends a batch in one sendmsg, which the kernel refuses (EMSGSIZE) when it
// exceeds the send buffer, and asks an acknowledgement of every message,
// which the kernel queues all at once and drops (ENOBUFS) when they exceed
// the receive buffer.
func bigBuffers(c *netlink.Conn) error { return netlinkbuf.Force(c, 1<<30, 1<<30) }

func (n *nftTable) list(t testing.TB) string {
	t.Helper()
	return n.ns.MustExec(t, "nft", "list", "table", string(Family), Table)
}

func (n *nftTable) mustLoad(t testing.TB, layout Layout, svcs []Service) time.Duration {
	t.Helper()
	c, err := FullLoad(layout, svcs)
	if err != nil {
		t.Fatal(err)
	}
	took, err := n.execRun(c)
	if err != nil {
		t.Fatalf("loading %d services, %s: %v", len(svcs), layout, err)
	}
	return took
}

// TestNetlinkMatchesExec applies the same partial-sync changes to the same
// loaded table through knftables (exec of nft) in one namespace and through
// the netlink translator in another, and checks that nft then lists the
// same table in both, and that the changes took effect.
func TestNetlinkMatchesExec(t *testing.T) {
	kerneltest.Require(t, "nft")
	svcs, err := Cluster(100, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, layout := range []Layout{SharedMap, NumgenCascade, KubeProxyLike} {
		t.Run(string(layout), func(t *testing.T) {
			viaExec, viaNetlink := newNFTTable(t), newNFTTable(t)
			viaExec.mustLoad(t, layout, svcs)
			if layout == NumgenCascade {
				// The translator covers this layout's full load too.
				full, err := FullLoad(layout, svcs)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := viaNetlink.netlinkRun(full); err != nil {
					t.Fatalf("full load through netlink: %v", err)
				}
			} else {
				viaNetlink.mustLoad(t, layout, svcs)
			}
			before := viaExec.list(t)
			if diff := cmp.Diff(before, viaNetlink.list(t)); diff != "" {
				t.Fatalf("the two loads differ (-exec +netlink):\n%s", diff)
			}
			to := netip.MustParseAddrPort("10.200.0.1:9090")
			steps := []Change{
				DeleteServiceIP(svcs[5]),
				ReplaceEndpoint(svcs[7], 3, to, "endpoint-extra"),
				DeleteServiceIP(svcs[9]),
				AddServiceIP(svcs[9]),
			}
			after := applyBoth(t, viaExec, viaNetlink, steps)
			for _, want := range []string{
				"chain endpoint-extra {\n\t\tmeta l4proto tcp dnat to " + to.String() + "\n\t}",
				"chain " + EndpointChain(svcs[7], 3) + " {\n\t\tmeta l4proto tcp dnat to " + to.String() + "\n\t}",
				svcs[9].ClusterIP.String() + " . tcp . 80 : goto " + ServiceChain(svcs[9]),
			} {
				if !strings.Contains(after, want) {
					t.Errorf("table after the changes lacks %q", want)
				}
			}
			if strings.Contains(after, svcs[5].ClusterIP.String()+" . tcp") {
				t.Errorf("table after the changes still has %s's element", svcs[5].ClusterIP)
			}
		})
	}
}

// applyBoth applies steps through nft to viaExec and through netlink to
// viaNetlink, fails t unless nft then lists the same table in both, and
// returns that listing.
func applyBoth(t *testing.T, viaExec, viaNetlink *nftTable, steps []Change) string {
	t.Helper()
	for i, c := range steps {
		if _, err := viaExec.execRun(c); err != nil {
			t.Fatalf("step %d through nft: %v", i, err)
		}
		if _, err := viaNetlink.netlinkRun(c); err != nil {
			t.Fatalf("step %d through netlink: %v", i, err)
		}
	}
	after := viaExec.list(t)
	if diff := cmp.Diff(after, viaNetlink.list(t)); diff != "" {
		t.Errorf("tables differ after the changes (-exec +netlink):\n%s", diff)
	}
	return after
}

// TestNetlinkRefuses checks that the translator refuses, before queuing
// anything, the objects and rules it does not translate, rather than sending
// something else to the kernel.
func TestNetlinkRefuses(t *testing.T) {
	nat := knftables.NATType
	for _, c := range []Change{
		{{Add, &knftables.Map{Name: "m", Type: "ipv4_addr : verdict"}}},
		{{Add, &knftables.Chain{Name: "base", Type: &nat}}},
		{{Delete, &knftables.Chain{Name: "x"}}},
		{{Add, &knftables.Rule{Chain: "x", Rule: "counter"}}},
		{{Add, &knftables.Rule{Chain: "x", Rule: "numgen random mod 2 vmap { 0 : goto a , 1 : goto b }"}}},
		{{Add, &knftables.Rule{Chain: "x", Rule: "numgen random mod 1 0 goto a"}}},
		{{Add, &knftables.Map{Name: ServiceIPsMap, Type: "ipv4_addr . inet_service : verdict"}}},
		{{Add, &knftables.Rule{Chain: "x", Rule: "meta l4proto tcp dnat to [fd00::1]:80"}}},
		{{Add, &knftables.Element{Map: EndpointsMap, Key: []string{"1"}, Value: []string{"goto x"}}}},
		{{Add, &knftables.Element{Map: ServiceIPsMap, Key: []string{"10.0.0.1", "udp", "53"}, Value: []string{"goto x"}}}},
		{{Add, &knftables.Element{Map: ServiceIPsMap, Key: []string{"10.0.0.1", "tcp", "80"}, Value: []string{"jump x"}}}},
		{{Add, &knftables.Chain{Name: "ok"}}, {Add, &knftables.Rule{Chain: "ok", Rule: "counter"}}},
		// The DataMap layout's elements: intervals, other protocols,
		// malformed keys and values, a set named as a map.
		{{Add, &knftables.Element{Set: FirewallAllowSet, Key: []string{"10.0.0.1", "tcp", "80", "10.1.0.0/16"}}}},
		{{Add, &knftables.Element{Map: EndpointsDataMap, Key: []string{"10.0.0.1", "udp", "53", "0"}, Value: []string{"10.1.0.1", "53"}}}},
		{{Add, &knftables.Element{Map: EndpointsDataMap, Key: []string{"10.0.0.1", "tcp", "80"}, Value: []string{"10.1.0.1", "80"}}}},
		{{Add, &knftables.Element{Map: EndpointsDataMap, Key: []string{"10.0.0.1", "tcp", "80", "-1"}, Value: []string{"10.1.0.1", "80"}}}},
		{{Add, &knftables.Element{Map: EndpointsDataMap, Key: []string{"10.0.0.1", "tcp", "80", "0"}, Value: []string{"fd00::1", "80"}}}},
		{{Add, &knftables.Element{Map: EndpointsDataMap, Key: []string{"10.0.0.1", "tcp", "80", "0"}, Value: []string{"10.1.0.1", "65536"}}}},
		{{Add, &knftables.Element{Set: EndpointsDataMap, Key: []string{"10.0.0.1", "tcp", "80", "0"}}}},
		{{Add, &knftables.Element{Map: HairpinSet, Key: []string{"10.1.0.1", "10.1.0.1"}, Value: []string{"x"}}}},
		{{Add, &knftables.Element{Set: HairpinSet, Key: []string{"10.1.0.1"}}}},
		{{Add, &knftables.Element{Set: NoEndpointRejectSet, Key: []string{"10.0.0.1", "tcp", "http"}}}},
		{{Flush, &knftables.Element{Set: NoEndpointDropSet, Key: []string{"10.0.0.1", "tcp", "80"}}}},
		{{Add, &knftables.Element{Map: ServiceIPsMap, Key: []string{"10.0.0.1", "tcp", "80"}, Value: []string{"goto a b"}}}},
	} {
		conn, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		if err := Netlink(conn, c); err == nil {
			t.Errorf("%s %T: translated, want an error", c[len(c)-1].Verb, c[len(c)-1].Object)
		}
	}
}

// TestTransportTimes measures, in a throwaway namespace, what the choice
// of transport is decided by: the full load of both layouts at 1,000 and
// 10,000 services of
// 10 endpoints through knftables (exec of `nft -f -`), and on top of each
// loaded table a one-element change (delete, add back an element of
// service-ips) and a one-chain change (ReplaceEndpoint) both through
// knftables and through netlink, and the cost of listing the table. The
// figures are logged (go test -v); medians of several runs.
func TestTransportTimes(t *testing.T) {
	if os.Getenv(benchEnv) != "1" {
		t.Skipf("set %s=1 to measure (loads 10,000-service tables: minutes)", benchEnv)
	}
	kerneltest.Require(t, "nft")
	const runs = 5
	for _, size := range []int{1000, 10000} {
		for _, layout := range []Layout{SharedMap, NumgenCascade, KubeProxyLike} {
			t.Run(fmt.Sprintf("%s/%d", layout, size), func(t *testing.T) {
				if layout == SharedMap && size > 1000 {
					// Every service chain's lookup makes the kernel's loop
					// check walk the whole shared verdict map, on the load
					// and on every later commit that adds a goto: quadratic.
					t.Skip("quadratic in the kernel's validation: minutes per commit at this size")
				}
				svcs, err := Cluster(size, 10)
				if err != nil {
					t.Fatal(err)
				}
				n := newNFTTable(t)
				t.Logf("%s %d services: full load through knftables (nft -f -) %v", layout, size, n.mustLoad(t, layout, svcs).Round(time.Millisecond))
				if layout == NumgenCascade {
					full, err := FullLoad(layout, svcs)
					if err != nil {
						t.Fatal(err)
					}
					took, err := newNFTTable(t).netlinkRun(full)
					if err != nil {
						t.Fatalf("full load through netlink: %v", err)
					}
					t.Logf("%s %d services: full load through netlink (one batch) %v", layout, size, took.Round(time.Millisecond))
				}
				svc := svcs[size/2]
				type way struct {
					name string
					run  func(Change) (time.Duration, error)
				}
				for _, w := range []way{{"knftables/exec", n.execRun}, {"netlink", n.netlinkRun}} {
					var del, add, chain []time.Duration
					for i := range runs {
						d := mustTime(t, w.run, DeleteServiceIP(svc))
						a := mustTime(t, w.run, AddServiceIP(svc))
						to := netip.AddrPortFrom(netip.MustParseAddr("10.250.0.1"), uint16(9000+i))
						c := mustTime(t, w.run, ReplaceEndpoint(svc, 0, to, fmt.Sprintf("endpoint-%s-%d", strings.ReplaceAll(w.name, "/", "-"), i)))
						del, add, chain = append(del, d), append(add, a), append(chain, c)
					}
					t.Logf("%s %d services, %s: one-element delete median %v, add median %v, one-chain change median %v (%d runs each; all: %v %v %v)",
						layout, size, w.name, median(del), median(add), median(chain), runs, del, add, chain)
				}
				for _, args := range [][]string{
					{"list", "table", string(Family), Table},
					{"--json", "--terse", "list", "table", string(Family), Table},
				} {
					var took []time.Duration
					for range 3 {
						start := time.Now()
						n.ns.MustExec(t, "nft", args...)
						took = append(took, time.Since(start))
					}
					t.Logf("%s %d services: nft %s median %v (%v)", layout, size, strings.Join(args, " "), median(took), took)
				}
			})
		}
	}
}

func mustTime(t *testing.T, run func(Change) (time.Duration, error), c Change) time.Duration {
	t.Helper()
	took, err := run(c)
	if err != nil {
		t.Fatal(err)
	}
	return took
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2].Round(10 * time.Microsecond)
}
