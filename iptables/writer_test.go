package iptables_test

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/testkit/golden"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/proxy"
)

// checkGolden compares got with testdata/writer/NAME.golden.
func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	golden.Check(t, filepath.Join("testdata", "writer", name+".golden"), got)
}

// TestWriterFullSyncGolden renders one small cluster per behaviour and
// compares the full sync's payload with a golden file; each payload must
// also be accepted by the strict Fake.
func TestWriterFullSyncGolden(t *testing.T) {
	const node = writertest.Node
	base := iptables.WriterConfig{
		Family:      v1.IPv4Protocol,
		Node:        proxy.NodeConfig{Name: node, ClusterCIDRs: []netip.Prefix{prefix("10.0.0.0/16")}},
		RandomFully: true,
	}
	local := func(ip string) ep { return ep{IP: ip, Node: node} }
	remote := func(ip string) ep { return ep{IP: ip, Node: "node-b"} }
	type goldenCase struct {
		name   string
		family v1.IPFamily
		config func(*iptables.WriterConfig)
		setup  func(c *cluster)
	}
	// writertest's scenarios, which nftables' writer renders too, then
	// this writer's own cases.
	var cases []goldenCase
	for _, sc := range writertest.Scenarios {
		cases = append(cases, goldenCase{name: sc.Name, setup: func(c *cluster) { sc.Setup(c.Cluster) }})
	}
	for _, ld := range writertest.LocalDetections {
		cases = append(cases, goldenCase{
			name:   ld.Name,
			family: ld.Family,
			config: func(cfg *iptables.WriterConfig) { cfg.Family, cfg.Node = ld.Family, ld.Node },
			setup: func(c *cluster) {
				c.PodCIDRs = ld.PodCIDRs
				ld.Setup(c.Cluster)
			},
		})
	}
	for _, tc := range append(cases, []goldenCase{{
		name: "affinity",
		setup: func(c *cluster) {
			c.setService(makeService("ns", "sticky", "10.96.0.14", withAffinity(300)))
			c.setEndpoints("ns", "sticky", tcp8080, local("10.0.1.1"), remote("10.0.2.1"), remote("10.0.2.2"))
		},
	}, {
		name: "masquerade-all-options",
		config: func(cfg *iptables.WriterConfig) {
			cfg.Node.ClusterCIDRs = []netip.Prefix{netip.Prefix{}}
			cfg.Node.MasqueradeAll = true
			cfg.Node.MasqueradeBit = ptr.To(0)
			cfg.RandomFully = false
			cfg.AcceptInvalid = true
			cfg.Node.NodePortAddresses = []netip.Prefix{prefix("192.168.0.0/24"), prefix("172.16.0.0/12")}
		},
		setup: func(c *cluster) {
			c.setService(makeService("ns", "web", "10.96.0.10", withNodePort(30080), withExternalLocal()))
			c.setEndpoints("ns", "web", tcp8080, local("10.0.1.1"), remote("10.0.2.1"))
		},
	}, {
		name:   "large-cluster",
		config: func(cfg *iptables.WriterConfig) { cfg.LargeClusterThreshold = 2 },
		setup: func(c *cluster) {
			c.setService(makeService("ns", "web", "10.96.0.10", withAffinity(60)))
			c.setEndpoints("ns", "web", tcp8080, local("10.0.1.1"), remote("10.0.2.1"), remote("10.0.2.2"))
		},
	}, {
		name:   "chains-per-commit",
		config: func(cfg *iptables.WriterConfig) { cfg.ChainsPerCommit = 3 },
		setup: func(c *cluster) {
			c.setService(makeService("ns", "a", "10.96.0.10"))
			c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"), remote("10.0.2.1"))
			c.setService(makeService("ns", "b", "10.96.0.11"))
			c.setEndpoints("ns", "b", tcp8080, local("10.0.1.2"))
			c.setService(makeService("ns", "c", "10.96.0.12"))
			c.setService(makeService("ns", "d", "10.96.0.13"))
			c.setEndpoints("ns", "d", tcp8080, local("10.0.1.3"))
		},
	}, {
		name:   "ipv6",
		family: v1.IPv6Protocol,
		config: func(cfg *iptables.WriterConfig) {
			cfg.Family = v1.IPv6Protocol
			cfg.Node.ClusterCIDRs = []netip.Prefix{prefix("fd00:10::/64")}
		},
		setup: func(c *cluster) {
			svc := makeService("ns", "web", "fd00:96::10", withNodePort(30080), withLoadBalancer("fd00:113::5", "fd00:1::/64"))
			// Dual-stack: the IPv4 side is the other writer's business.
			svc.Spec.ClusterIPs = []string{"10.96.0.10", "fd00:96::10"}
			c.setService(svc)
			c.setEndpoints("ns", "web", tcp8080, local("fd00:10::1"), remote("fd00:10::2"))
		},
	}}...) {
		t.Run(tc.name, func(t *testing.T) {
			family := tc.family
			if family == "" {
				family = v1.IPv4Protocol
			}
			cfg := base
			if tc.config != nil {
				tc.config(&cfg)
			}
			c := newCluster(family, node)
			c.NodeIPs = []netip.Addr{addr("192.168.0.10"), addr("fd00:1::10")}
			tc.setup(c)
			w := mustWriter(t, cfg)
			f := iptablestest.NewFake()
			if family == v1.IPv6Protocol {
				f = iptablestest.NewIPv6Fake()
			}
			res := syncFake(t, w, f, c.input())
			if !res.Full {
				t.Fatal("first sync was not full")
			}
			if got := bytes.Count(res.Payload, []byte("\n")); got != res.Lines {
				t.Errorf("Lines = %d, payload has %d", res.Lines, got)
			}
			checkGolden(t, tc.name, res.Payload)
		})
	}
}

// topLevel are the chains a partial sync edits rule by rule; their order
// after partial syncs differs from a full sync's, but not what they hold.
var topLevel = map[string]bool{
	"KUBE-SERVICES": true, "KUBE-NODEPORTS": true, "KUBE-EXTERNAL-SERVICES": true, "KUBE-PROXY-FIREWALL": true,
}

// canonical returns a Fake's dump with the rules of the top-level chains
// sorted, except the node-port rule, which must stay last.
func canonical(dump string) string {
	lines := strings.SplitAfter(dump, "\n")
	var out []string
	var block []string
	flush := func() {
		slices.SortStableFunc(block, func(a, b string) int {
			an, bn := strings.Contains(a, "-j KUBE-NODEPORTS"), strings.Contains(b, "-j KUBE-NODEPORTS")
			switch {
			case an && !bn:
				return 1
			case bn && !an:
				return -1
			}
			return strings.Compare(a, b)
		})
		out = append(out, block...)
		block = nil
	}
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "-A" && topLevel[f[1]] {
			block = append(block, l)
			continue
		}
		flush()
		out = append(out, l)
	}
	flush()
	return strings.Join(out, "")
}

// step is one change to a cluster, followed by a sync.
type step struct {
	name   string
	change func(c *cluster)
	// check, if set, looks at the partial payload.
	check func(t *testing.T, payload string)
}

// runSteps applies steps one by one with partial syncs, and after each
// checks that the Fake holds exactly what a fresh writer's full sync of
// the same cluster gives a fresh Fake.
func runSteps(t *testing.T, cfg iptables.WriterConfig, c *cluster, steps []step) {
	t.Helper()
	w := mustWriter(t, cfg)
	f := iptablestest.NewFake()
	syncFake(t, w, f, c.input())
	for _, s := range steps {
		s.change(c)
		res := syncFake(t, w, f, c.input())
		if res.Full {
			t.Fatalf("%s: sync was full", s.name)
		}
		if s.check != nil {
			s.check(t, string(res.Payload))
		}
		fresh := iptablestest.NewFake()
		syncFake(t, mustWriter(t, cfg), fresh, &proxy.FamilyInput{Services: c.ServiceMap, Endpoints: c.EndpointsMap, NodeLabels: c.NodeLabels})
		if diff := cmp.Diff(canonical(fresh.Dump()), canonical(f.Dump())); diff != "" {
			t.Fatalf("%s: after the partial sync the rules differ from a full sync's (-full +partial):\n%s\npayload:\n%s", s.name, diff, res.Payload)
		}
		// canonical ignores the order of KUBE-SERVICES, except that the
		// node-port rule must stay last, which it checks here.
		rules := f.Rules(iptables.TableNAT, iptables.KubeServicesChain)
		if len(rules) == 0 || !strings.HasSuffix(rules[len(rules)-1], "-j KUBE-NODEPORTS") {
			t.Fatalf("%s: KUBE-SERVICES does not end with the node-port rule: %q", s.name, rules)
		}
	}
}

func scnConfig() iptables.WriterConfig { return scnWriterConfig(true) }

func mustContain(t *testing.T, what, payload string, subs ...string) {
	t.Helper()
	for _, s := range subs {
		if !strings.Contains(payload, s) {
			t.Errorf("%s: payload lacks %q:\n%s", what, s, payload)
		}
	}
}

func mustNotContain(t *testing.T, what, payload string, subs ...string) {
	t.Helper()
	for _, s := range subs {
		if strings.Contains(payload, s) {
			t.Errorf("%s: payload has %q:\n%s", what, s, payload)
		}
	}
}

// TestWriterPartialSyncsInSmallCommits runs the partial syncs with the nat
// table split into commits of a few chains.
func TestWriterPartialSyncsInSmallCommits(t *testing.T) {
	cfg := scnConfig()
	cfg.ChainsPerCommit = 2
	runSteps(t, cfg, scnCluster(), []step{
		{name: "remove an endpoint", change: scnRemoveEndpoint},
		{name: "add a service", change: scnAddService},
		{name: "delete a service", change: scnDeleteService},
		{name: "add another and change web", change: func(c *cluster) {
			scnAddLate(c)
			c.setEndpoints(scnNS, "web", scnWebPorts, scnEP(scnPodA), scnEP(scnPodB))
		}, check: func(t *testing.T, p string) {
			if n := strings.Count(p, "*nat\n"); n < 2 {
				t.Errorf("payload has %d nat commits, want several:\n%s", n, p)
			}
		}},
	})
}

func TestWriterPartialSyncs(t *testing.T) {
	webTCP := portName(scnNS, "web", "tcp", v1.ProtocolTCP)
	np := portName(scnNS, "np", "p", v1.ProtocolTCP)
	added := portName(scnNS, "added", "p", v1.ProtocolTCP)
	sepA := string(kubeChains.Endpoint(webTCP, scnPodA+":8080"))
	sepB := string(kubeChains.Endpoint(webTCP, scnPodB+":8080"))
	runSteps(t, scnConfig(), scnCluster(), []step{{
		name:   "remove an endpoint",
		change: scnRemoveEndpoint,
		check: func(t *testing.T, p string) {
			// Endpoint changes never touch the top-level chains, and the
			// endpoint chain that did not change is not rewritten.
			mustNotContain(t, "remove an endpoint", p, "KUBE-SERVICES", "KUBE-NODEPORTS", ":"+sepA, "*filter", "ns/np", "ns/lb")
			mustContain(t, "remove an endpoint", p, ":"+string(kubeChains.ServiceCluster(webTCP))+" ", ":"+sepB+" ", "-X "+sepB+"\n")
		},
	}, {
		name:   "add an endpoint back",
		change: func(c *cluster) { c.setEndpoints(scnNS, "web", scnWebPorts, scnEP(scnPodA), scnEP(scnPodB)) },
		check: func(t *testing.T, p string) {
			mustNotContain(t, "add an endpoint", p, "KUBE-SERVICES", "-X ")
		},
	}, {
		name:   "add a service",
		change: scnAddService,
		check: func(t *testing.T, p string) {
			mustContain(t, "add a service", p, "-I KUBE-SERVICES 1 -m comment --comment \"demo/added:p cluster IP\"")
			mustNotContain(t, "add a service", p, ":KUBE-SERVICES", "-D ", "ns/web")
		},
	}, {
		name:   "delete a service",
		change: scnDeleteService,
		check: func(t *testing.T, p string) {
			mustContain(t, "delete a service", p,
				"-D KUBE-SERVICES -m comment --comment \"demo/np:p cluster IP\"",
				"-D KUBE-SERVICES -m comment --comment \"demo/np:p external IP\"",
				"-D KUBE-NODEPORTS -m comment --comment demo/np:p ",
				"-X "+string(kubeChains.ServiceCluster(np))+"\n",
				"-X "+string(kubeChains.ServiceExternal(np))+"\n")
			mustNotContain(t, "delete a service", p, ":KUBE-SERVICES", "added")
		},
	}, {
		name: "service loses all endpoints",
		change: func(c *cluster) {
			c.deleteEndpoints(scnNS, "added")
		},
		check: func(t *testing.T, p string) {
			mustContain(t, "lose endpoints", p,
				"-D KUBE-SERVICES -m comment --comment \"demo/added:p cluster IP\"",
				"*filter\n-A KUBE-SERVICES -m comment --comment \"demo/added:p has no endpoints\"",
				"-X "+string(kubeChains.ServiceCluster(added))+"\n")
		},
	}, {
		name:   "service gets endpoints again",
		change: func(c *cluster) { c.setEndpoints(scnNS, "added", tcp8080, scnEP(scnPodC)) },
		check: func(t *testing.T, p string) {
			mustContain(t, "regain endpoints", p, "-D KUBE-SERVICES -m comment --comment \"demo/added:p has no endpoints\"")
		},
	}, {
		name: "service changes its cluster IP and ports",
		change: func(c *cluster) {
			c.setService(makeService(scnNS, "added", "10.96.0.30", withPorts(
				v1.ServicePort{Name: "q", Port: 81, Protocol: v1.ProtocolTCP},
			)))
			c.setEndpoints(scnNS, "added", []discoveryv1.EndpointPort{slicePort("q", scnPort, v1.ProtocolTCP)}, scnEP(scnPodC))
		},
	}, {
		name: "externalTrafficPolicy flips to Local",
		change: func(c *cluster) {
			c.setService(makeService(scnNS, "lb", scnLBIP, withLoadBalancer(scnLBVIP, scnClientIP+"/32"), withExternalLocal(), withHealthCheckNodePort(30999)))
		},
	}, {
		name: "affinity turned on",
		change: func(c *cluster) {
			c.setService(makeService(scnNS, "web", scnWebIP, withAffinity(30), withPorts(
				v1.ServicePort{Name: "tcp", Port: 80, Protocol: v1.ProtocolTCP},
				v1.ServicePort{Name: "udp", Port: 80, Protocol: v1.ProtocolUDP},
			)))
		},
		check: func(t *testing.T, p string) {
			// The endpoint chains' content changed (--set), so they are
			// rewritten even though the endpoints did not change.
			mustContain(t, "affinity", p, ":"+sepA+" ", "-m recent --name "+sepA+" --set")
		},
	}, {
		name: "delete a service and its endpoints separately",
		change: func(c *cluster) {
			c.deleteService(scnNS, "sticky")
		},
	}, {
		name:   "nothing changed",
		change: func(c *cluster) {},
		check: func(t *testing.T, p string) {
			if p != "" {
				t.Errorf("empty change: payload %q, want none", p)
			}
		},
	}})
}

// TestWriterPartialSyncCostsOnlyTheChange checks that among many services,
// changing one writes nothing about the others.
func TestWriterPartialSyncCostsOnlyTheChange(t *testing.T) {
	c := newCluster(v1.IPv4Protocol, "node-a")
	for i := range 50 {
		name := "svc-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		c.setService(makeService("ns", name, netip.AddrFrom4([4]byte{10, 96, 1, byte(i + 1)}).String(), withNodePort(int32(30000+i))))
		c.setEndpoints("ns", name, tcp8080, ep{IP: netip.AddrFrom4([4]byte{10, 0, 1, byte(i + 1)}).String()}, ep{IP: netip.AddrFrom4([4]byte{10, 0, 2, byte(i + 1)}).String()})
	}
	w := mustWriter(t, iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-a", ClusterCIDRs: []netip.Prefix{prefix("10.0.0.0/16")}}})
	f := iptablestest.NewFake()
	full := syncFake(t, w, f, c.input())
	c.setEndpoints("ns", "svc-aa", tcp8080, ep{IP: "10.0.1.1"})
	res := syncFake(t, w, f, c.input())
	if res.Full || res.ServicePortsWritten != 1 {
		t.Fatalf("full=%v, ports written %d; want a partial sync of one port", res.Full, res.ServicePortsWritten)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(res.Payload)), "\n") {
		if strings.HasPrefix(line, "*") || line == "COMMIT" {
			continue
		}
		if !strings.Contains(line, "ns/svc-aa:p") && !strings.HasPrefix(line, ":KUBE-") && !strings.HasPrefix(line, "-X KUBE-SEP-") && !strings.HasPrefix(line, "-A KUBE-EXT-") {
			t.Errorf("partial payload line not about the changed service: %s", line)
		}
	}
	if len(res.Payload) > len(full.Payload)/20 {
		t.Errorf("partial payload is %d bytes of a %d-byte full one", len(res.Payload), len(full.Payload))
	}
}

// TestWriterUnsortedEndpoints feeds endpoints in no particular order (a
// hand-made EndpointsMap), which the writer must handle as well as the
// sorted lists of EndpointsMap.Update.
func TestWriterUnsortedEndpoints(t *testing.T) {
	svc, err := changetracker.NewBaseServicePort(klog.Background(), makeService("ns", "web", "10.96.0.10"), &v1.ServicePort{Name: "p", Port: 80, Protocol: v1.ProtocolTCP}, v1.IPv4Protocol)
	if err != nil {
		t.Fatal(err)
	}
	name := portName("ns", "web", "p", v1.ProtocolTCP)
	mk := func(ips ...string) []changetracker.Endpoint {
		var eps []changetracker.Endpoint
		for _, ip := range ips {
			eps = append(eps, changetracker.NewBaseEndpoint(changetracker.EndpointInfo{IP: addr(ip), Port: 8080, Ready: true, Serving: true}))
		}
		return eps
	}
	changed := changetracker.UpdateEndpointsMapResult{UpdatedServices: sets.New(name.NamespacedName)}
	svcs := changetracker.ServicePortMap{name: svc}
	cfg := iptables.WriterConfig{Family: v1.IPv4Protocol}
	w := mustWriter(t, cfg)
	f := iptablestest.NewFake()
	for i, list := range [][]string{
		{"10.0.0.3", "10.0.0.1", "10.0.0.2"},
		{"10.0.0.2", "10.0.0.3", "10.0.0.4"},
		{"10.0.0.9", "10.0.0.2", "10.0.0.1", "10.0.0.3"},
		{"10.0.0.1"},
	} {
		eps := changetracker.EndpointsMap{name: mk(list...)}
		res := syncFake(t, w, f, &proxy.FamilyInput{Services: svcs, Endpoints: eps, EndpointChanges: changed})
		if i > 0 && res.Full {
			t.Fatalf("step %d synced fully", i)
		}
		fresh := iptablestest.NewFake()
		syncFake(t, mustWriter(t, cfg), fresh, &proxy.FamilyInput{Services: svcs, Endpoints: eps})
		if diff := cmp.Diff(canonical(fresh.Dump()), canonical(f.Dump())); diff != "" {
			t.Fatalf("step %d (%v): rules differ from a full sync's (-full +partial):\n%s", i, list, diff)
		}
	}
}

func TestWriterFullSyncTriggers(t *testing.T) {
	ctx := context.Background()
	clk := clocktesting.NewFakePassiveClock(time.Unix(1_000_000, 0))
	c := scnCluster()
	w := mustWriter(t, iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: scnNode}, FullSyncPeriod: time.Hour, Clock: clk})
	f := iptablestest.NewFake()
	type event struct {
		name     string
		before   func()
		wantFull bool
	}
	for _, e := range []event{
		{name: "first sync", wantFull: true},
		{name: "nothing changed", wantFull: false},
		{name: "service added", before: func() { scnAddService(c) }, wantFull: false},
		{name: "RequestFullSync", before: w.RequestFullSync, wantFull: true},
		{name: "after the requested full sync", wantFull: false},
		{name: "node labels changed", before: func() { c.NodeLabels = map[string]string{v1.LabelTopologyZone: "z"} }, wantFull: true},
		{name: "node labels unchanged", wantFull: false},
		{name: "less than FullSyncPeriod later", before: func() { clk.SetTime(clk.Now().Add(59 * time.Minute)) }, wantFull: false},
		{name: "FullSyncPeriod after the last full sync", before: func() { clk.SetTime(clk.Now().Add(time.Minute)) }, wantFull: true},
		{name: "just after the periodic full sync", before: func() { clk.SetTime(clk.Now().Add(time.Minute)) }, wantFull: false},
	} {
		if e.before != nil {
			e.before()
		}
		res := syncFake(t, w, f, c.input())
		if res.Full != e.wantFull {
			t.Errorf("%s: full = %v, want %v", e.name, res.Full, e.wantFull)
		}
	}

	// A failed restore, or a sync whose outcome is never reported, makes
	// the next one full.
	w.Sync(ctx, c.input())
	w.Applied(errors.New("iptables-restore: line 3 failed"))
	if res := syncFake(t, w, f, c.input()); !res.Full {
		t.Error("sync after a failed restore is not full")
	}
	w.Sync(ctx, c.input())
	if res := syncFake(t, w, f, c.input()); !res.Full {
		t.Error("sync after an unreported one is not full")
	}
	// Reports that match no sync are ignored.
	w.Applied(errors.New("late"))
	if res := syncFake(t, w, f, c.input()); res.Full {
		t.Error("a second Applied for one sync made the next sync full")
	}
}

// TestWriterRecoversFromFailedRestore checks that chains a failed partial
// sync meant to delete are deleted by the full sync that follows, and that
// the Fake, like the kernel, leaves the rules as they were.
func TestWriterRecoversFromFailedRestore(t *testing.T) {
	ctx := context.Background()
	c := scnCluster()
	cfg := scnConfig()
	w := mustWriter(t, cfg)
	f := iptablestest.NewFake()
	syncFake(t, w, f, c.input())
	before := f.Dump()

	scnDeleteService(c)
	scnRemoveEndpoint(c)
	scnAddLate(c)
	res := w.Sync(ctx, c.input())
	if res.Full || res.ChainsDeleted == 0 {
		t.Fatalf("full=%v deleted=%d, want a partial sync deleting chains", res.Full, res.ChainsDeleted)
	}
	res.Payload = scnBreak(res.Payload)
	err := applyFake(f, w, res)
	if err == nil {
		t.Fatal("broken payload was accepted")
	}
	w.Applied(err)
	if diff := cmp.Diff(before, f.Dump()); diff != "" {
		t.Errorf("failed restore changed the rules:\n%s", diff)
	}

	res = syncFake(t, w, f, c.input())
	if !res.Full {
		t.Fatal("sync after the failure is not full")
	}
	fresh := iptablestest.NewFake()
	syncFake(t, mustWriter(t, cfg), fresh, &proxy.FamilyInput{Services: c.ServiceMap, Endpoints: c.EndpointsMap})
	if diff := cmp.Diff(fresh.Dump(), f.Dump()); diff != "" {
		t.Errorf("after recovering, rules differ from a fresh full sync's (-fresh +recovered):\n%s", diff)
	}
}

// TestWriterDeletesLeftoverChains checks that chains noted as existing at
// start-up (a previous run's) are deleted by the first full sync when no
// service needs them, and that chains that are not the writer's are left
// alone.
func TestWriterDeletesLeftoverChains(t *testing.T) {
	ctx := context.Background()
	gone := portName("old", "gone", "p", v1.ProtocolTCP)
	web := portName(scnNS, "web", "tcp", v1.ProtocolTCP)
	leftover := "*nat\n" +
		":KUBE-SERVICES - [0:0]\n" +
		":KUBE-CUSTOM - [0:0]\n" +
		":" + string(kubeChains.ServiceCluster(gone)) + " - [0:0]\n" +
		":" + string(kubeChains.Endpoint(gone, "10.9.9.9:80")) + " - [0:0]\n" +
		":" + string(kubeChains.ServiceCluster(web)) + " - [0:0]\n" +
		"-A KUBE-SERVICES -d 10.96.9.9/32 -j " + string(kubeChains.ServiceCluster(gone)) + "\n" +
		"-A " + string(kubeChains.ServiceCluster(gone)) + " -j " + string(kubeChains.Endpoint(gone, "10.9.9.9:80")) + "\n" +
		"COMMIT\n"
	f := iptablestest.NewFake()
	if err := f.RestoreAll(ctx, []byte(leftover), iptables.NoFlushTables, iptables.NoRestoreCounters); err != nil {
		t.Fatal(err)
	}
	var save bytes.Buffer
	if err := f.SaveInto(ctx, iptables.TableNAT, &save); err != nil {
		t.Fatal(err)
	}
	w := mustWriter(t, scnConfig())
	w.NoteExistingChains(iptables.ChainsFromSave(save.Bytes()))
	res := syncFake(t, w, f, scnCluster().input())
	if res.ChainsDeleted != 2 {
		t.Errorf("ChainsDeleted = %d, want 2", res.ChainsDeleted)
	}
	chains := f.Chains(iptables.TableNAT)
	for _, c := range []iptables.Chain{kubeChains.ServiceCluster(gone), kubeChains.Endpoint(gone, "10.9.9.9:80")} {
		if slices.Contains(chains, c) {
			t.Errorf("leftover chain %s not deleted", c)
		}
	}
	for _, c := range []iptables.Chain{"KUBE-CUSTOM", kubeChains.ServiceCluster(web)} {
		if !slices.Contains(chains, c) {
			t.Errorf("chain %s deleted", c)
		}
	}
}

func TestWriterSkipsBadServicePorts(t *testing.T) {
	logger := klog.Background().V(10)
	v6, err := changetracker.NewBaseServicePort(logger, makeService("ns", "v6", "fd00::1"), &v1.ServicePort{Name: "p", Port: 80, Protocol: v1.ProtocolTCP}, v1.IPv6Protocol)
	if err != nil {
		t.Fatal(err)
	}
	good, err := changetracker.NewBaseServicePort(logger, makeService("ns", "good", "10.96.0.1"), &v1.ServicePort{Name: "p", Port: 80, Protocol: v1.ProtocolTCP}, v1.IPv4Protocol)
	if err != nil {
		t.Fatal(err)
	}
	svcs := changetracker.ServicePortMap{
		portName("ns", "v6", "p", v1.ProtocolTCP):   v6,
		portName("ns", "nil", "p", v1.ProtocolTCP):  nil,
		portName("ns", "good", "p", v1.ProtocolTCP): good,
	}
	w := mustWriter(t, iptables.WriterConfig{Family: v1.IPv4Protocol})
	res := syncFake(t, w, iptablestest.NewFake(), &proxy.FamilyInput{Services: svcs})
	if res.ServicePorts != 1 {
		t.Errorf("ServicePorts = %d, want 1 (only the IPv4 port)", res.ServicePorts)
	}
	mustNotContain(t, "bad ports", string(res.Payload), "ns/v6", "ns/nil")
	mustContain(t, "bad ports", string(res.Payload), "ns/good:p has no endpoints")
}

func TestWriterResultCounts(t *testing.T) {
	c := scnCluster()
	w := mustWriter(t, scnConfig())
	res := syncFake(t, w, iptablestest.NewFake(), c.input())
	want := iptables.SyncResult{
		Full:                     true,
		ServicePortsWritten:      10,
		ServicePorts:             10,
		Endpoints:                14,
		NoLocalEndpointsExternal: 1, // remote
	}
	got := res
	got.Payload, got.Lines = nil, 0
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
}

func TestNewWriterRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  iptables.WriterConfig
		want string
	}{
		{"no family", iptables.WriterConfig{}, "IP family"},
		{"bad bit", iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{MasqueradeBit: ptr.To(32)}}, "masquerade bit 32"},
		{"negative bit", iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{MasqueradeBit: ptr.To(-1)}}, "masquerade bit -1"},
		{"two cluster CIDRs of the family", iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{ClusterCIDRs: []netip.Prefix{prefix("10.0.0.0/16"), prefix("fd00::/64"), prefix("10.1.0.0/16")}}}, "10.0.0.0/16 and 10.1.0.0/16"},
		{"unknown local mode", iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{DetectLocalMode: "PodCIDR"}}, `DetectLocalMode "PodCIDR"`},
		{"bridge mode without a bridge", iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{DetectLocalMode: proxy.LocalModeBridgeInterface}}, "BridgeInterface: interface name must not be empty"},
		{"bridge name that would end the argument", iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{DetectLocalMode: proxy.LocalModeBridgeInterface, BridgeInterface: "cni0 -j ACCEPT"}}, "BridgeInterface: interface name"},
		{"prefix with a wildcard", iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{DetectLocalMode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: "veth+"}}, "InterfaceNamePrefix: interface name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := iptables.NewWriter(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

// TestEnsureJumpRules checks that Writer.EnsureJumpRules adds each of
// the writer's jumps once however often it runs, and, with
// LocalhostNodePorts, the jumps to KUBE-FIREWALL first in INPUT and
// OUTPUT: without them the drop rule that guards the loopback node ports
// (CVE-2020-8558) is never reached.
func TestEnsureJumpRules(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  iptables.WriterConfig
		// wantFirst is the target of the first rule of filter INPUT and
		// OUTPUT.
		wantFirst iptables.Chain
	}{
		{"default", iptables.WriterConfig{Family: v1.IPv4Protocol}, "KUBE-PROXY-FIREWALL"},
		{"localhost node ports", iptables.WriterConfig{Family: v1.IPv4Protocol, LocalhostNodePorts: true}, "KUBE-FIREWALL"},
		{"localhost node ports, other prefix", iptables.WriterConfig{Family: v1.IPv4Protocol, LocalhostNodePorts: true, ChainPrefix: otherPrefix}, "KUBE-FIREWALL"},
		{"IPv6 ignores localhost node ports", iptables.WriterConfig{Family: v1.IPv6Protocol, LocalhostNodePorts: true}, "KUBE-PROXY-FIREWALL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			w := mustWriter(t, tc.cfg)
			f := iptablestest.NewFake()
			if tc.cfg.Family == v1.IPv6Protocol {
				f = iptablestest.NewIPv6Fake()
			}
			for range 2 {
				if err := w.EnsureJumpRules(ctx, f); err != nil {
					t.Fatal(err)
				}
			}
			// Every rule of the built-in chains is one of the writer's
			// jumps, and each jump is there once.
			want := map[string]int{}
			for _, j := range w.JumpRules() {
				want[string(j.Table)+" "+string(j.Chain)+" -> "+string(j.Target)]++
			}
			got := map[string]int{}
			for _, table := range []iptables.Table{iptables.TableFilter, iptables.TableNAT} {
				for _, c := range []iptables.Chain{iptables.ChainInput, iptables.ChainOutput, iptables.ChainForward, iptables.ChainPrerouting, iptables.ChainPostrouting} {
					for _, r := range f.Rules(table, c) {
						_, target, _ := strings.Cut(r, "-j ")
						got[string(table)+" "+string(c)+" -> "+target]++
					}
				}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("jumps in the built-in chains (-want +got):\n%s", diff)
			}
			for _, c := range []iptables.Chain{iptables.ChainInput, iptables.ChainOutput} {
				if rules := f.Rules(iptables.TableFilter, c); len(rules) == 0 || !strings.HasSuffix(rules[0], "-j "+string(tc.wantFirst)) {
					t.Errorf("filter %s is %q, want a jump to %s first", c, rules, tc.wantFirst)
				}
			}
		})
	}
}

// TestWriterNodeIPs checks that the node's addresses come with each input:
// a change of those of the writer's family makes the sync full, with the
// rules a fresh writer writes for the new ones, while a change of the
// other family's alone leaves the sync partial. A load balancer whose
// source ranges hold a node address admits its own VIP as a source, so
// the firewall chain shows which addresses the writer has.
func TestWriterNodeIPs(t *testing.T) {
	cfg := iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: writertest.Node}}
	c := newCluster(v1.IPv4Protocol, writertest.Node)
	c.setService(makeService("ns", "lb", "10.96.0.20", withLoadBalancer("203.0.113.5", "192.168.0.10/32")))
	c.setEndpoints("ns", "lb", tcp8080, ep{IP: "10.0.1.1", Node: writertest.Node})
	c.NodeIPs = []netip.Addr{addr("192.168.0.10")}
	w, f := mustWriter(t, cfg), iptablestest.NewFake()
	syncFake(t, w, f, c.input())
	fwChain := kubeChains.ServiceFirewall(svcPortName("ns", "lb", "p"))
	admitsVIP := func() bool {
		return strings.Contains(strings.Join(f.Rules(iptables.TableNAT, fwChain), "\n"), "-s 203.0.113.5/32")
	}
	if !admitsVIP() {
		t.Fatalf("the VIP is not admitted while a node address is in the source range:\n%s", f.Dump())
	}
	for _, step := range []struct {
		name     string
		nodeIPs  []netip.Addr
		wantFull bool
	}{
		{"same addresses in another order, with one of the other family", []netip.Addr{addr("fd00:1::10"), addr("192.168.0.10")}, false},
		{"an address of the writer's family more", []netip.Addr{addr("192.168.0.10"), addr("192.168.0.11")}, true},
		{"the first one gone", []netip.Addr{addr("192.168.0.11")}, true},
	} {
		c.NodeIPs = step.nodeIPs
		res := syncFake(t, w, f, c.input())
		if res.Full != step.wantFull {
			t.Errorf("%s: sync full=%v, want %v", step.name, res.Full, step.wantFull)
		}
		fresh := iptablestest.NewFake()
		syncFake(t, mustWriter(t, cfg), fresh, c.input())
		if diff := cmp.Diff(canonical(fresh.Dump()), canonical(f.Dump())); diff != "" {
			t.Errorf("%s: rules differ from a fresh writer's (-fresh +got):\n%s", step.name, diff)
		}
	}
	if admitsVIP() {
		t.Errorf("the VIP is still admitted after the node address in the source range went:\n%s", f.Dump())
	}
}

// TestWriterPodCIDRs checks that in NodeCIDR mode the node's pod range
// of a sync's input is what tells local traffic: none detects nothing (no
// masquerade rule for cluster IPs, no short-circuit of pod traffic), and a
// change rewrites every port's rules, in a full sync, as a fresh writer
// would; the pod ranges of the other family, and a change of them, do not
// matter.
func TestWriterPodCIDRs(t *testing.T) {
	cfg := iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: writertest.Node, DetectLocalMode: proxy.LocalModeNodeCIDR,
		ClusterCIDRs: []netip.Prefix{prefix("10.0.0.0/16")}}}
	c := newCluster(v1.IPv4Protocol, writertest.Node)
	c.setService(makeService("ns", "web", "10.96.0.10"))
	c.setEndpoints("ns", "web", tcp8080, ep{IP: "10.0.1.1", Node: writertest.Node})
	c.setService(makeService("ns", "lb", "10.96.0.11", withLoadBalancer("203.0.113.5"), withNodePort(31000), withExternalLocal(), withHealthCheckNodePort(32000)))
	c.setEndpoints("ns", "lb", tcp8080, ep{IP: "10.0.1.2", Node: writertest.Node})
	w, f := mustWriter(t, cfg), iptablestest.NewFake()
	syncFake(t, w, f, c.input())
	// The rules that match local traffic, as the Fake dumps them.
	matches := func() []string {
		var out []string
		for _, r := range strings.Split(f.Dump(), "\n") {
			if strings.Contains(r, "KUBE-MARK-MASQ") && strings.Contains(r, "cluster IP") || strings.Contains(r, "pod traffic") {
				out = append(out, r)
			}
		}
		return out
	}
	want := func(cidr string) []string {
		return []string{
			`-A KUBE-EXT-6MXKDKS4RXDXPGND -s ` + cidr + ` -m comment --comment "pod traffic for ns/lb:p external destinations" -j KUBE-SVC-6MXKDKS4RXDXPGND`,
			`-A KUBE-SVC-6MXKDKS4RXDXPGND ! -s ` + cidr + ` -d 10.96.0.11/32 -p tcp -m comment --comment "ns/lb:p cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ`,
			`-A KUBE-SVC-7X3VEG6HU4XBR2VS ! -s ` + cidr + ` -d 10.96.0.10/32 -p tcp -m comment --comment "ns/web:p cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ`,
		}
	}
	if got := matches(); len(got) != 0 {
		t.Fatalf("without a pod CIDR, local-detection rules %q", got)
	}
	for _, step := range []struct {
		name     string
		podCIDRs []netip.Prefix
		wantFull bool
		want     []string
	}{
		{"pod CIDR allocated", []netip.Prefix{prefix("fd00:10:0:1::/64"), prefix("10.0.1.0/24")}, true,
			want("10.0.1.0/24")},
		{"the other family's changed", []netip.Prefix{prefix("10.0.1.0/24"), prefix("fd00:10:0:2::/64")}, false,
			want("10.0.1.0/24")},
		{"pod CIDR changed", []netip.Prefix{prefix("10.0.7.0/24")}, true,
			want("10.0.7.0/24")},
		{"pod CIDR gone", nil, true, nil},
	} {
		c.PodCIDRs = step.podCIDRs
		res := syncFake(t, w, f, c.input())
		if res.Full != step.wantFull {
			t.Errorf("%s: sync full=%v, want %v", step.name, res.Full, step.wantFull)
		}
		if diff := cmp.Diff(step.want, matches()); diff != "" {
			t.Errorf("%s: local-detection matches (-want +got):\n%s", step.name, diff)
		}
		fresh := iptablestest.NewFake()
		syncFake(t, mustWriter(t, cfg), fresh, c.input())
		if diff := cmp.Diff(canonical(fresh.Dump()), canonical(f.Dump())); diff != "" {
			t.Errorf("%s: rules differ from a fresh writer's (-fresh +got):\n%s", step.name, diff)
		}
	}
}

// TestWriterReadsItsFamilyOfNodeConfig checks that one NodeConfig serves
// both families: the writer renders from the prefixes of its own family
// exactly what it renders when given those alone.
func TestWriterReadsItsFamilyOfNodeConfig(t *testing.T) {
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		t.Run(string(family), func(t *testing.T) {
			v4 := proxy.NodeConfig{Name: writertest.Node, ClusterCIDRs: []netip.Prefix{prefix("10.0.0.0/16")}, NodePortAddresses: []netip.Prefix{prefix("192.168.0.0/24")}}
			v6 := proxy.NodeConfig{Name: writertest.Node, ClusterCIDRs: []netip.Prefix{prefix("fd00:10::/64")}, NodePortAddresses: []netip.Prefix{prefix("fd00:1::/64")}}
			both := proxy.NodeConfig{Name: writertest.Node,
				ClusterCIDRs:      append(slices.Clone(v4.ClusterCIDRs), v6.ClusterCIDRs...),
				NodePortAddresses: append(slices.Clone(v6.NodePortAddresses), v4.NodePortAddresses...)}
			alone, svcIP, podIP, fake := v4, "10.96.0.10", "10.0.1.1", iptablestest.NewFake
			if family == v1.IPv6Protocol {
				alone, svcIP, podIP, fake = v6, "fd00:96::10", "fd00:10::1", iptablestest.NewIPv6Fake
			}
			c := newCluster(family, writertest.Node)
			c.setService(makeService("ns", "web", svcIP, withNodePort(30080), withExternalLocal()))
			c.setEndpoints("ns", "web", tcp8080, ep{IP: podIP, Node: writertest.Node})
			in := c.input()
			fa, fb := fake(), fake()
			syncFake(t, mustWriter(t, iptables.WriterConfig{Family: family, Node: alone}), fa, in)
			syncFake(t, mustWriter(t, iptables.WriterConfig{Family: family, Node: both}), fb, in)
			if diff := cmp.Diff(fa.Dump(), fb.Dump()); diff != "" {
				t.Errorf("(-own family alone +both families):\n%s", diff)
			}
			if !strings.Contains(fa.Dump(), alone.NodePortAddresses[0].String()) {
				t.Errorf("the node-port prefix %s is not in the rules:\n%s", alone.NodePortAddresses[0], fa.Dump())
			}
		})
	}
}

// TestWriterNodePortPrimary checks that node ports on the node's own
// addresses (kube-proxy's "primary") follow the addresses each input
// gives, and that a node without one serves none rather than all.
func TestWriterNodePortPrimary(t *testing.T) {
	cfg := iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: writertest.Node, NodePortPrimary: true,
		NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.168.0.10/32")}}}
	c := newCluster(v1.IPv4Protocol, writertest.Node)
	c.setService(makeService("ns", "np", "10.96.0.30", withNodePort(30080)))
	c.setEndpoints("ns", "np", tcp8080, ep{IP: "10.0.1.1", Node: writertest.Node})
	w, f := mustWriter(t, cfg), iptablestest.NewFake()
	for _, step := range []struct {
		nodeIPs []netip.Addr
		want    []string
	}{
		{[]netip.Addr{addr("192.168.0.10")}, []string{"-d 192.168.0.10/32 "}},
		{[]netip.Addr{addr("192.168.0.11"), addr("fd00:1::11")}, []string{"-d 192.168.0.11/32 "}},
		{nil, nil},
	} {
		c.NodeIPs = step.nodeIPs
		syncFake(t, w, f, c.input())
		var got []string
		for _, r := range f.Rules(iptables.TableNAT, iptables.KubeServicesChain) {
			if strings.Contains(r, "KUBE-NODEPORTS") {
				got = append(got, r)
			}
		}
		if len(got) != len(step.want) {
			t.Errorf("node IPs %v: node-port rules %q, want %d", step.nodeIPs, got, len(step.want))
			continue
		}
		for i, m := range step.want {
			if !strings.Contains(got[i], m) {
				t.Errorf("node IPs %v: node-port rule %q, want it to match %q", step.nodeIPs, got[i], m)
			}
		}
	}
}
