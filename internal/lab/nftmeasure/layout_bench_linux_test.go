package nftmeasure

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	proxynft "github.com/proxykit/proxykit/nftables"
)

// nftRusage runs `nft -f -` (with -c if check) on c's text inside the
// namespace and returns the wall, user and system time of the nft process:
// user time is nft's parsing and evaluation, system time mostly the
// kernel's work on the batch, which --check sends too (the kernel then
// aborts it).
func (n *nftTable) nftRusage(c Change, check bool) (wall, user, sys time.Duration, err error) {
	tx := n.nft.NewTransaction()
	if err := c.Transaction(tx); err != nil {
		return 0, 0, 0, err
	}
	args := []string{"-f", "-"}
	if check {
		args = append([]string{"-c"}, args...)
	}
	err = n.ns.Do(func() error {
		cmd := exec.Command("nft", args...)
		cmd.Stdin = strings.NewReader(tx.String())
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		start := time.Now()
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("nft %v: %w: %s", args, err, stderr.String())
		}
		wall = time.Since(start)
		user, sys = cmd.ProcessState.UserTime(), cmd.ProcessState.SystemTime()
		return nil
	})
	return wall, user, sys, err
}

// rewriteChains is how a writer repairs drifted chains: each added (if
// missing), flushed and given its rules from skeleton again.
func rewriteChains(skeleton Change, names []string) Change {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	var c Change
	for _, op := range skeleton {
		switch o := op.Object.(type) {
		case *knftables.Chain:
			if want[o.Name] {
				c = append(c, op, Op{Flush, &knftables.Chain{Name: o.Name}})
			}
		case *knftables.Rule:
			if want[o.Chain] {
				c = append(c, op)
			}
		}
	}
	return c
}

func mustDesired(t testing.TB, skeleton, elements Change) *Desired {
	t.Helper()
	d, err := NewDesired(skeleton, elements)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// generation reads the namespace's nf_tables generation as the nftables
// block's resync does.
func generation(t testing.TB, n *nftTable) uint32 {
	t.Helper()
	g, err := proxynft.NewKernelState("/run/netns/" + n.ns.Name).Generation()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func (n *nftTable) conn(t testing.TB) *nftables.Conn {
	t.Helper()
	conn, err := nftables.New(nftables.WithNetNSFd(int(n.ns.Handle())))
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestDataMapDriftRepair deletes, by hand, an element of the endpoint map
// and a shared chain's rules, adds an element nothing wants, and checks
// that DetectDrift finds exactly those and that the repair (elements
// through netlink, chains rewritten through nft) leaves a table that nft
// lists as the freshly loaded one.
func TestDataMapDriftRepair(t *testing.T) {
	svcs, n := loadedDataMap(t, 50)
	fresh := n.list(t)
	skeleton, elements := DataMapLoad(svcs)
	desired := mustDesired(t, skeleton, elements)
	d, err := DetectDrift(n.conn(t), desired)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Empty() {
		t.Fatalf("drift on a freshly loaded table: %+v", d)
	}
	gen := generation(t, n)
	if again := generation(t, n); again != gen {
		t.Fatalf("generation moved from %d to %d with no commit", gen, again)
	}
	n.ns.MustExec(t, "nft", "delete", "element", "ip", Table, EndpointsDataMap, "{ 172.30.0.5 . tcp . 80 . 3 }")
	n.ns.MustExec(t, "nft", "delete", "element", "ip", Table, EndpointsDataMap, "{ 172.30.0.6 . tcp . 80 . 2 }")
	n.ns.MustExec(t, "nft", "add", "element", "ip", Table, EndpointsDataMap, "{ 172.30.0.6 . tcp . 80 . 2 : 10.99.0.1 . 1 }")
	n.ns.MustExec(t, "nft", "add", "element", "ip", Table, NoEndpointDropSet, "{ 172.30.9.9 . tcp . 80 }")
	n.ns.MustExec(t, "nft", "flush", "chain", "ip", Table, LBChain(7))
	if after := generation(t, n); after == gen {
		t.Errorf("generation still %d after commits by hand", after)
	}
	d, err = DetectDrift(n.conn(t), desired)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Chains) != 1 || d.Chains[0] != LBChain(7) || d.Extra() != 1 {
		t.Errorf("drift: chains %v, %d extra elements; want chain %s and one extra element", d.Chains, d.Extra(), LBChain(7))
	}
	var ops []string
	for _, op := range d.Elements {
		e := op.Object.(*knftables.Element)
		ops = append(ops, fmt.Sprintf("%s %s%s %s", op.Verb, e.Set, e.Map, strings.Join(e.Key, " ")))
	}
	wantOps := []string{
		"add endpoints 172.30.0.5 tcp 80 3",
		"delete endpoints 172.30.0.6 tcp 80 2",
		"add endpoints 172.30.0.6 tcp 80 2",
	}
	if diff := cmp.Diff(wantOps, ops); diff != "" {
		t.Errorf("element repairs (-want +got):\n%s", diff)
	}
	conn := n.conn(t)
	if err := RepairElements(conn, d); err != nil {
		t.Fatal(err)
	}
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := n.execRun(rewriteChains(skeleton, d.Chains)); err != nil {
		t.Fatal(err)
	}
	if got := n.list(t); got != fresh {
		t.Errorf("after the repair nft lists another table than the fresh load")
	}
}

// TestLayoutTimes measures the DataMap layout against the nftables
// block's kernel targets (BENCHMARKS.md) at 1,000, 10,000 and 30,000
// services of 10 endpoints: the full
// load all through nft and split (rules through nft, elements through
// netlink), a periodic resync that finds nothing changed, the detection
// and repair of objects deleted by hand, and the one-endpoint changes both
// ways; and, at 10,000, nft's own time (user) against the kernel's (sys)
// for DataMap and for the cascade with and without endpoint chains. Figures
// are logged (go test -v).
func TestLayoutTimes(t *testing.T) {
	if os.Getenv(benchEnv) != "1" {
		t.Skipf("set %s=1 to measure (loads 30,000-service tables: minutes)", benchEnv)
	}
	kerneltest.Require(t, "nft")
	const runs = 5
	for _, size := range []int{1000, 10000, 30000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			svcs, err := Cluster(size, 10)
			if err != nil {
				t.Fatal(err)
			}
			skeleton, elements := DataMapLoad(svcs)
			full := append(append(Change{}, skeleton...), elements...)

			// All through nft, nft's and the kernel's parts apart.
			viaNft := newNFTTable(t)
			wall, user, sys, err := viaNft.nftRusage(full, false)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("data-map %d: full load nft -f: %v (nft user %v, sys %v), %d objects", size, wall.Round(time.Millisecond), user.Round(time.Millisecond), sys.Round(time.Millisecond), len(full))

			// Split: skeleton through nft, elements through netlink.
			n := newNFTTable(t)
			sk, err := n.execRun(skeleton)
			if err != nil {
				t.Fatal(err)
			}
			el, err := n.netlinkRun(elements)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("data-map %d: full load split: %v (skeleton through nft %v, %d elements through netlink %v)", size, (sk + el).Round(time.Millisecond), sk.Round(time.Millisecond), len(elements), el.Round(time.Millisecond))

			start := time.Now()
			desired := mustDesired(t, skeleton, elements)
			t.Logf("data-map %d: indexing the desired table for DetectDrift (a writer keeps it as it syncs): %v", size, time.Since(start).Round(time.Millisecond))

			// Periodic resync, nothing changed: the generation, recorded
			// after the last commit, is unchanged.
			gen := generation(t, n)
			var fast []time.Duration
			for range runs {
				start := time.Now()
				g := generation(t, n)
				fast = append(fast, time.Since(start))
				if g != gen {
					t.Fatalf("generation moved from %d to %d with no commit", gen, g)
				}
			}
			t.Logf("data-map %d: resync with nothing changed, generation check: median %v (%v)", size, median(fast), fast)

			// Periodic resync after a commit by someone else: detect.
			var detect []time.Duration
			for range 3 {
				start := time.Now()
				d, err := DetectDrift(n.conn(t), desired)
				detect = append(detect, time.Since(start))
				if err != nil {
					t.Fatal(err)
				}
				if !d.Empty() {
					t.Fatalf("drift on an unchanged table: %v %v %d", d.Chains, d.Elements, d.Extra())
				}
			}
			t.Logf("data-map %d: resync after another commit (DetectDrift over netlink, dial included), nothing drifted: median %v (%v)", size, median(detect), detect)

			// One element and one chain's rules deleted by hand.
			svc := svcs[size/3]
			n.ns.MustExec(t, "nft", "delete", "element", "ip", Table, EndpointsDataMap,
				fmt.Sprintf("{ %s . tcp . 80 . 3 }", svc.ClusterIP))
			n.ns.MustExec(t, "nft", "flush", "chain", "ip", Table, LBChain(10))
			start = time.Now()
			d, err := DetectDrift(n.conn(t), desired)
			if err != nil {
				t.Fatal(err)
			}
			found := time.Since(start)
			if len(d.Chains) != 1 || len(d.Elements) != 1 {
				t.Fatalf("drift after deleting by hand: chains %v, elements %v", d.Chains, d.Elements)
			}
			start = time.Now()
			conn := n.conn(t)
			if err := RepairElements(conn, d); err != nil {
				t.Fatal(err)
			}
			if err := conn.Flush(); err != nil {
				t.Fatal(err)
			}
			repairEl := time.Since(start)
			repairCh, err := n.execRun(rewriteChains(skeleton, d.Chains))
			if err != nil {
				t.Fatal(err)
			}
			if d, err := DetectDrift(n.conn(t), desired); err != nil || !d.Empty() {
				t.Fatalf("drift after the repair: %+v, %v", d, err)
			}
			t.Logf("data-map %d: one element and one chain deleted by hand: detected in %v, element repaired through netlink in %v, chain rewritten through nft in %v",
				size, found.Round(time.Millisecond), repairEl.Round(100*time.Microsecond), repairCh.Round(100*time.Microsecond))

			// The same with a Watcher: only what others changed is read.
			w, err := Watch(n.conn(t))
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			n.ns.MustExec(t, "nft", "delete", "element", "ip", Table, EndpointsDataMap,
				fmt.Sprintf("{ %s . tcp . 80 . 5 }", svcs[size/4].ClusterIP))
			n.ns.MustExec(t, "nft", "flush", "chain", "ip", Table, LBChain(10))
			start = time.Now()
			scope, changed, err := w.Until(generation(t, n), 10*time.Second)
			if err != nil || !changed || scope == nil {
				t.Fatalf("Until: %+v, %v, %v", scope, changed, err)
			}
			d, err = DetectDriftIn(n.conn(t), desired, scope)
			if err != nil {
				t.Fatal(err)
			}
			found = time.Since(start)
			if len(d.Chains) != 1 || len(d.Elements) != 1 {
				t.Fatalf("drift in scope after deleting by hand: chains %v, elements %v", d.Chains, d.Elements)
			}
			start = time.Now()
			conn = n.conn(t)
			if err := RepairElements(conn, d); err != nil {
				t.Fatal(err)
			}
			if err := conn.Flush(); err != nil {
				t.Fatal(err)
			}
			repairEl = time.Since(start)
			if _, err := n.execRun(rewriteChains(skeleton, d.Chains)); err != nil {
				t.Fatal(err)
			}
			t.Logf("data-map %d: the same with a Watcher: detected (generation, Until, DetectDriftIn) in %v, element repaired in %v",
				size, found.Round(100*time.Microsecond), repairEl.Round(100*time.Microsecond))

			// One-endpoint changes, each run on another service. (the Watcher attached: the
			// kernel also sends it every change).
			type way struct {
				name string
				run  func(Change) (time.Duration, error)
			}
			next := size / 2
			for _, w := range []way{{"knftables/exec", n.execRun}, {"netlink", n.netlinkRun}} {
				var replace, remove []time.Duration
				for i := range runs {
					to := netip.AddrPortFrom(netip.MustParseAddr("10.250.0.1"), uint16(9000+i))
					replace = append(replace, mustTime(t, w.run, DataMapReplaceEndpoint(svcs[next], 0, to)))
					remove = append(remove, mustTime(t, w.run, DataMapRemoveEndpoint(svcs[next+1], 4)))
					next += 2
				}
				t.Logf("data-map %d, %s: replace one endpoint median %v, remove one endpoint (count change, one verdict) median %v (%d runs each; all: %v %v)",
					size, w.name, median(replace), median(remove), runs, replace, remove)
			}

			// What an element delete costs against an add, alone.
			var adds, dels []time.Duration
			for i := range runs {
				h := Change{{Add, hairpinElement(netip.AddrFrom4([4]byte{10, 251, 0, byte(i)}))}}
				adds = append(adds, mustTime(t, n.netlinkRun, h))
				h[0].Verb = Delete
				dels = append(dels, mustTime(t, n.netlinkRun, h))
			}
			t.Logf("data-map %d, netlink: one element added alone median %v, deleted alone median %v (%v %v)", size, median(adds), median(dels), adds, dels)

			// What a resync must not do: read the table as nft does, or
			// dump the endpoint map (quadratic in the kernel: not at 30,000).
			start = time.Now()
			n.list(t)
			t.Logf("data-map %d: nft list table %v", size, time.Since(start).Round(time.Millisecond))
			if size <= 10000 {
				table := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: Table}
				start = time.Now()
				got, err := n.conn(t).GetSetElements(&nftables.Set{Table: table, Name: EndpointsDataMap, IsMap: true})
				if err != nil {
					t.Fatal(err)
				}
				dump := time.Since(start)
				keys := make([]*knftables.Element, len(got))
				for i, e := range got {
					if keys[i], err = endpointKeyElement(string(e.Key)); err != nil {
						t.Fatal(err)
					}
				}
				start = time.Now()
				if _, err := proxynft.NewKernelState("/run/netns/" + n.ns.Name).CheckElements(keys); err != nil {
					t.Fatal(err)
				}
				t.Logf("data-map %d: the endpoint map's %d elements: dumped in %v, looked up by key in %v", size, len(got), dump.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
			}

			if size == 1000 {
				// A lookup rule per service: quadratic, so only small sizes.
				for _, m := range []int{1000, 2000, 4000} {
					more, err := Cluster(m, 10)
					if err != nil {
						t.Fatal(err)
					}
					c, err := fullLoadOf(dataMapPerService, more)
					if err != nil {
						t.Fatal(err)
					}
					wall, user, sys, err := newNFTTable(t).nftRusage(c, false)
					if err != nil {
						t.Fatal(err)
					}
					t.Logf("%s %d: nft -f %v (nft user %v, sys %v)", dataMapPerService, m, wall.Round(time.Millisecond), user.Round(time.Millisecond), sys.Round(time.Millisecond))
				}
			}
			if size != 10000 {
				return
			}

			// The rare case at scale: 1% of the services with ClientIP
			// affinity, in kube-proxy's shape.
			aff := slices.Clone(svcs)
			for i := LocalEvery / 2; i < len(aff); i += LocalEvery {
				aff[i].Affinity = 3 * time.Hour
			}
			skeleton, elements = DataMapLoad(aff)
			na := newNFTTable(t)
			sk, err = na.execRun(skeleton)
			if err != nil {
				t.Fatal(err)
			}
			el, err = na.netlinkRun(elements)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("data-map %d, 1%% with affinity: full load split: %v (skeleton with the affinity services' %d objects through nft %v, elements through netlink %v)",
				size, (sk + el).Round(time.Millisecond), len(skeleton), sk.Round(time.Millisecond), el.Round(time.Millisecond))
			var affChange, plain []time.Duration
			for i := range runs {
				svc := aff[LocalEvery/2+i*LocalEvery]
				to := netip.AddrPortFrom(netip.MustParseAddr("10.252.0.1"), uint16(9000+i))
				affChange = append(affChange, mustTime(t, na.execRun, AffinityReplaceEndpoint(svc, 0, to)))
				plain = append(plain, mustTime(t, na.netlinkRun, DataMapReplaceEndpoint(aff[size/2+i], 0, to)))
			}
			t.Logf("data-map %d, 1%% with affinity: replace one endpoint of an affinity service (nft -f) median %v, of another service (netlink) median %v (%v %v)",
				size, median(affChange), median(plain), affChange, plain)
			for _, layout := range []Layout{NumgenCascade, cascadeNoEndpointChains} {
				c, err := fullLoadOf(layout, svcs)
				if err != nil {
					t.Fatal(err)
				}
				for _, check := range []bool{true, false} {
					wall, user, sys, err := newNFTTable(t).nftRusage(c, check)
					if err != nil {
						t.Fatal(err)
					}
					t.Logf("%s %d: nft -f (check only: %v): %v (nft user %v, sys %v), %d objects", layout, size, check, wall.Round(time.Millisecond), user.Round(time.Millisecond), sys.Round(time.Millisecond), len(c))
				}
			}
		})
	}
}

// cascadeNoEndpointChains is NumgenCascade with every endpoint chain
// folded into its service chain (the numgen rule DNATs itself): a
// measurement of what the chains cost, not a layout (it cannot mark
// hairpin traffic per endpoint).
const cascadeNoEndpointChains Layout = "numgen-cascade-without-endpoint-chains"

// dataMapPerService is the data map addressed from every service's own
// chain (`dnat ip to numgen random mod N offset O map @endpoints`), the
// first shape tried for the data-map idea: a measurement of what a lookup
// rule per service costs, not a layout.
const dataMapPerService Layout = "data-map-per-service-rule"

func fullLoadOf(layout Layout, svcs []Service) (Change, error) {
	if layout == dataMapPerService {
		c, err := FullLoad(NumgenCascade, nil)
		if err != nil {
			return nil, err
		}
		c = append(c, Op{Add, &knftables.Map{Name: EndpointsMap, TypeOf: "numgen random mod 1 : ip daddr . tcp dport"}})
		for _, svc := range svcs {
			base := svc.Index * MaxEndpoints
			c = append(c,
				Op{Add, &knftables.Chain{Name: ServiceChain(svc)}},
				Op{Add, &knftables.Rule{Chain: ServiceChain(svc), Rule: fmt.Sprintf(
					"meta l4proto tcp dnat ip to numgen random mod %d offset %d map @%s", len(svc.Endpoints), base, EndpointsMap)}})
			for j, ep := range svc.Endpoints {
				c = append(c, Op{Add, &knftables.Element{Map: EndpointsMap, Key: []string{fmt.Sprint(base + j)},
					Value: []string{ep.Addr().String(), fmt.Sprint(ep.Port())}}})
			}
			c = append(c, AddServiceIP(svc)...)
		}
		return c, nil
	}
	if layout != cascadeNoEndpointChains {
		return FullLoad(layout, svcs)
	}
	c, err := FullLoad(NumgenCascade, nil)
	if err != nil {
		return nil, err
	}
	for _, svc := range svcs {
		c = append(c, Op{Add, &knftables.Chain{Name: ServiceChain(svc)}})
		n := len(svc.Endpoints)
		for j, ep := range svc.Endpoints {
			rule := "meta l4proto tcp dnat to " + ep.String()
			if k := n - j; k > 1 {
				rule = fmt.Sprintf("numgen random mod %d 0 %s", k, rule)
			}
			c = append(c, Op{Add, &knftables.Rule{Chain: ServiceChain(svc), Rule: rule}})
		}
		c = append(c, AddServiceIP(svc)...)
	}
	return c, nil
}

// ownRun applies c through netlink and tells w the batch was the
// writer's, when no other commit came between.
func (n *nftTable) ownRun(t testing.TB, w *Watcher, c Change) {
	t.Helper()
	before := generation(t, n)
	if _, err := n.netlinkRun(c); err != nil {
		t.Fatal(err)
	}
	if after := generation(t, n); after == before+1 {
		w.Own(after)
	}
}

// TestWatcherScopesDrift checks that a Watcher narrows a resync to what
// others changed: the writer's own endpoint change is left out, an
// endpoint element and a chain changed by hand are in, and the narrowed
// DetectDriftIn finds exactly those.
func TestWatcherScopesDrift(t *testing.T) {
	svcs, n := loadedDataMap(t, 50)
	w, err := Watch(n.conn(t))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	to := netip.MustParseAddrPort("10.250.0.1:9000")
	n.ownRun(t, w, DataMapReplaceEndpoint(svcs[20], 0, to))
	svcs[20].Endpoints[0] = to
	n.ns.MustExec(t, "nft", "delete", "element", "ip", Table, EndpointsDataMap, "{ 172.30.0.5 . tcp . 80 . 3 }")
	n.ns.MustExec(t, "nft", "flush", "chain", "ip", Table, LBChain(7))
	scope, changed, err := w.Until(generation(t, n), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !changed || scope == nil {
		t.Fatalf("Until: changed %v, scope %+v; want a narrow scope", changed, scope)
	}
	if diff := cmp.Diff(map[string]bool{LBChain(7): true}, scope.Chains); diff != "" {
		t.Errorf("chains in scope (-want +got):\n%s", diff)
	}
	if len(scope.EndpointKeys) != 1 || scope.SmallSets {
		t.Errorf("elements in scope: %d endpoint keys, small sets %v; want the one deleted key", len(scope.EndpointKeys), scope.SmallSets)
	}
	skeleton, elements := DataMapLoad(svcs)
	d, err := DetectDriftIn(n.conn(t), mustDesired(t, skeleton, elements), scope)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Chains) != 1 || d.Chains[0] != LBChain(7) || len(d.Elements) != 1 || d.Extra() != 0 {
		t.Errorf("drift: chains %v, elements %d, extra %d; want %s and one missing element", d.Chains, len(d.Elements), d.Extra(), LBChain(7))
	}

	// Nothing since: Until finds no change.
	if _, changed, err := w.Until(generation(t, n), 50*time.Millisecond); err == nil || changed {
		t.Errorf("Until with no new batch: changed %v, err %v; want a timeout (the batch was already read)", changed, err)
	}
}
