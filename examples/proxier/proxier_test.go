package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/conntrack/conntracktest"
	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/ebpf/ebpftest"
	"github.com/proxykit/proxykit/ipset/ipsettest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/ipvs/ipvstest"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/kernel"
	"github.com/proxykit/proxykit/kubeproxy"
	"github.com/proxykit/proxykit/nftables"
)

// eventually polls check every 50ms until it returns nil, and fails t with
// its last error after timeout.
func eventually(t testing.TB, timeout time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// scrape returns the samples of a /metrics page (text format), keyed by
// name and labels as written, such as
// `kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"}`.
func scrape(get func(url string) (int, string, error), url string) (map[string]float64, error) {
	code, body, err := get(url)
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET %s: status %d", url, code)
	}
	samples := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("bad metrics line %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("bad metrics line %q: %w", line, err)
		}
		samples[line[:i]] = v
	}
	return samples, nil
}

// httpGet is a plain GET from this process.
func httpGet(url string) (int, string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// fakeNode is a proxier's machine made of fakes: iptables of both
// families, conntrack, IPVS, the dummy interface, ipsets, a kernel
// directory tree (release 6.1.0, with no module loaded until the test
// says), and listeners on loopback ports chosen by the system, recorded by
// the address asked for.
type fakeNode struct {
	ipt4, ipt6 *iptablestest.Fake
	acct       *iptablestest.NFAcct
	ct         *conntracktest.Fake
	lb         *ipvstest.Fake
	binder     *fakeBinder
	sets       *ipsettest.Fake
	// lostSet names a set that iptables-restore is to find missing, as
	// if someone destroyed it: rules matching on it fail.
	lostSet atomic.Value
	// ipvsOpens and tableOpens count the times IPVS mode's kernel side,
	// and the IPVS table with it, were opened; ipvsOpen those not yet
	// closed.
	ipvsOpens, tableOpens, ipvsOpen atomic.Int32
	root                            string
	mu                              sync.Mutex
	listeners                       map[string]string
	// nfts are nftables mode's Fakes, by family and table.
	nfts map[string]*knftables.Fake
}

// nft returns the Fake of family's table, made on first use.
func (n *fakeNode) nft(family knftables.Family, table string) *knftables.Fake {
	n.mu.Lock()
	defer n.mu.Unlock()
	key := string(family) + " " + table
	if n.nfts[key] == nil {
		n.nfts[key] = knftables.NewFake(family, table)
	}
	return n.nfts[key]
}

// nftDump returns the state of family's table ("" if there is none).
func (n *fakeNode) nftDump(family knftables.Family, table string) string {
	return n.nft(family, table).Dump()
}

func newFakeNode(t *testing.T) *fakeNode {
	n := &fakeNode{
		ct:        conntracktest.NewFake(),
		acct:      iptablestest.NewNFAcct(),
		lb:        ipvstest.NewFake(),
		binder:    &fakeBinder{Binder: ipvstest.NewBinder(), addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("192.168.10.11")}},
		sets:      ipsettest.NewFake(),
		root:      t.TempDir(),
		listeners: map[string]string{},
		nfts:      map[string]*knftables.Fake{},
	}
	n.lostSet.Store("")
	exists := func(name string) bool {
		if n.lostSet.Load() == name {
			return false
		}
		_, err := n.sets.ListEntries(context.Background(), name)
		return err == nil
	}
	n.ipt4 = iptablestest.NewFake(iptablestest.WithIPSets(exists))
	n.ipt6 = iptablestest.NewIPv6Fake(iptablestest.WithIPSets(exists))
	kernelTree(t, n.root, nil)
	for name, v := range map[string]string{
		"net/netfilter/nf_conntrack_tcp_timeout_established": "432000",
		"net/netfilter/nf_conntrack_tcp_timeout_close_wait":  "60",
		"net/netfilter/nf_conntrack_tcp_be_liberal":          "0",
		"net/ipv4/ip_forward":                                "0",
		"net/ipv4/vs/conntrack":                              "0",
		"net/ipv4/vs/expire_nodest_conn":                     "0",
		"net/ipv4/vs/expire_quiescent_template":              "0",
		"net/ipv4/vs/conn_reuse_mode":                        "1",
	} {
		path := filepath.Join(n.root, "proc", "sys", name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// withIPVS gives the node's kernel every module IPVS mode needs, loaded.
func (n *fakeNode) withIPVS(t *testing.T) *fakeNode {
	v, err := kernel.ParseVersion("6.1.0")
	if err != nil {
		t.Fatal(err)
	}
	kernelTree(t, n.root, append(kernel.RequiredIPVSModules(v), kernel.IPSetModules()...))
	return n
}

// fakeBinder is the fake dummy-interface binder, with node addresses the
// test may change.
type fakeBinder struct {
	*ipvstest.Binder
	mu    sync.Mutex
	addrs []netip.Addr
}

func (b *fakeBinder) HostAddresses(context.Context, string) ([]netip.Addr, error) {
	return b.nodeAddrs(), nil
}

func (b *fakeBinder) nodeAddrs() []netip.Addr {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.addrs)
}

func (b *fakeBinder) setAddrs(addrs []netip.Addr) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.addrs = addrs
}

func (n *fakeNode) environment(t *testing.T, stdout io.Writer) *environment {
	return &environment{stdout: stdout, Host: &kubeproxy.Host{
		DetectBackend: func(context.Context) (iptables.Backend, error) { return iptables.BackendNFT, nil },
		NewIPTables: func(_ context.Context, p v1.IPFamily, b iptables.Backend) (iptables.Interface, error) {
			if b != iptables.BackendNFT {
				t.Errorf("newIPTables for backend %s, want the detected nft", b)
			}
			if p == v1.IPv6Protocol {
				return n.ipt6, nil
			}
			return n.ipt4, nil
		},
		NewNFAcct: func() (iptables.NFAcct, error) { return n.acct, nil },
		Conntrack: n.ct,
		Kernel:    &kernel.Kernel{Root: n.root},
		OpenIPVS: func(_ context.Context, table bool) (*ipvsmode.Handles, error) {
			node := &ipvsmode.Handles{Binder: n.binder, IPSets: n.sets, Release: func() { n.ipvsOpen.Add(-1) }}
			if table {
				node.IPVS = n.lb
				n.tableOpens.Add(1)
			}
			n.ipvsOpens.Add(1)
			n.ipvsOpen.Add(1)
			return node, nil
		},
		NewNFTables: func(_ context.Context, family knftables.Family, table string) (knftables.Interface, error) {
			return n.nft(family, table), nil
		},
		NFTTableLookup: func(family knftables.Family, table string) nftables.TableLookup {
			return func(context.Context) (bool, error) {
				fake := n.nft(family, table)
				fake.RLock()
				defer fake.RUnlock()
				return fake.Table != nil, nil
			}
		},
		// ebpf mode's maps, empty at each start, as a node's after
		// --cleanup.
		OpenEBPF: func(cfg ebpf.DatapathConfig) (ebpf.Maps, error) {
			return ebpftest.NewFake(cfg.Family, ebpf.Sizes{}), nil
		},
		HostAddresses: func() ([]netip.Addr, error) {
			t.Error("the node's addresses were taken from the host, not its Node object")
			return nil, errors.New("no host here")
		},
		Listen: func(ctx context.Context, network, address string) (net.Listener, error) {
			var lc net.ListenConfig
			l, err := lc.Listen(ctx, network, "127.0.0.1:0")
			if err != nil {
				return nil, err
			}
			n.mu.Lock()
			defer n.mu.Unlock()
			n.listeners[address] = l.Addr().String()
			return l, nil
		},
	}}
}

// url returns the URL of path on the listener opened for address.
func (n *fakeNode) url(t *testing.T, address, path string) string {
	t.Helper()
	var got string
	eventually(t, 5*time.Second, "listener for "+address, func() error {
		n.mu.Lock()
		defer n.mu.Unlock()
		got = n.listeners[address]
		if got == "" {
			return fmt.Errorf("no listener opened for %s; have %v", address, n.listeners)
		}
		return nil
	})
	return "http://" + got + path
}

// readSysctl reads sysctl name (slash form) of the node's tree.
func readSysctl(t *testing.T, root, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "proc", "sys", name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// fakeRun is the proxier run in this process, in the background, on a
// fakeNode, against a copy of the demo cluster that the test may edit.
type fakeRun struct {
	node       *fakeNode
	demo       string
	manifest   string
	metricsURL string
	cancel     context.CancelFunc
	done       chan error
}

// startOnFakes starts the proxier on node with the flags every fake run
// uses and args, and waits for its metrics server.
func startOnFakes(t *testing.T, node *fakeNode, args ...string) *fakeRun {
	t.Helper()
	demo, err := os.ReadFile(filepath.Join("testdata", "demo-cluster.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	r := &fakeRun{node: node, demo: string(demo), manifest: filepath.Join(dir, "cluster.yaml"), done: make(chan error, 1)}
	r.edit(t, r.demo)
	o, err := parseOptions(append([]string{"--manifests", dir, "--hostname-override", "node-a",
		"--sync-period", "1s", "--min-sync-period", "0", "--cluster-cidr", "10.244.0.0/16",
		"--healthz-bind-address", "127.0.0.1:10256", "--metrics-bind-address", "127.0.0.1:10249"}, args...), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var log logBuffer
	ctx, cancel := context.WithCancel(testLogger(&log, 4))
	r.cancel = cancel
	go func() { r.done <- run(ctx, o, node.environment(t, io.Discard)) }()
	t.Cleanup(func() {
		cancel()
		if t.Failed() {
			t.Logf("proxier log:\n%s", log.String())
		}
	})
	r.metricsURL = node.url(t, "127.0.0.1:10249", "/metrics")
	return r
}

// edit writes the manifest.
func (r *fakeRun) edit(t *testing.T, manifest string) {
	t.Helper()
	if err := os.WriteFile(r.manifest, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
}

// metric returns a sample of the proxier's /metrics (0 when absent).
func (r *fakeRun) metric(t *testing.T, name string) float64 {
	t.Helper()
	m, err := scrape(httpGet, r.metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	return m[name]
}

// editDemo returns the demo cluster with the api Service's endpoint on
// node-a and the dns Service's on node-b removed.
func editDemo(t *testing.T, demo string) string {
	t.Helper()
	edited := strings.Replace(demo, "- {addresses: [10.244.1.30], nodeName: node-a, conditions: {ready: true}}\n", "", 1)
	edited = strings.Replace(edited, "- {addresses: [10.244.2.53], nodeName: node-b, conditions: {ready: true}}\n", "", 1)
	if strings.Count(edited, "\n") != strings.Count(demo, "\n")-2 {
		t.Fatal("the demo file's endpoints changed: the edit does not apply")
	}
	return edited
}

// waitEditSynced waits until the sync of editDemo's edit shows: the
// health-check node port of hcURL (shop/api's) says no local endpoint, and
// conntrack holds no flow (the one to dns on node-b is stale).
func (r *fakeRun) waitEditSynced(t *testing.T, hcURL string) {
	t.Helper()
	eventually(t, 10*time.Second, "the edit's sync", func() error {
		code, body, err := httpGet(hcURL)
		if err != nil || code != http.StatusServiceUnavailable {
			return fmt.Errorf("health-check node port: %d %s %v", code, body, err)
		}
		if flows := r.node.ct.Flows(); len(flows) != 0 {
			return fmt.Errorf("conntrack still holds %v", flows)
		}
		return nil
	})
}

// stop cancels the run and checks that it returns nil.
func (r *fakeRun) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("run returned %v after cancel, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}

// TestProxierWithFakes runs the whole composition against the fakes of
// iptables and conntrack, on the demo cluster in a manifest directory the
// test edits: the first sync is full, an edit is a partial sync that
// reaches the rules, conntrack and the health-check node port, a flush of
// the canary brings a full resync, the metrics have kube-proxy's names, and
// cancelling stops everything and leaves the rules.
func TestProxierWithFakes(t *testing.T) {
	node := newFakeNode(t)
	// A UDP flow to kube-system/dns through the endpoint on node-b, which
	// the edit below removes.
	stale := conntracktest.NewFlow(conntrack.ProtocolUDP, netip.MustParseAddrPort("10.244.1.20:40000"),
		netip.MustParseAddrPort("10.96.0.53:53"), netip.MustParseAddrPort("10.244.2.53:53"))
	if err := node.ct.AddFlows(stale); err != nil {
		t.Fatal(err)
	}
	r := startOnFakes(t, node)
	ctx, demo, metricsURL := context.Background(), r.demo, r.metricsURL
	metric := func(name string) float64 { t.Helper(); return r.metric(t, name) }
	healthURL := node.url(t, "127.0.0.1:10256", "/healthz")
	hcURL := node.url(t, ":32000", "/")
	const (
		full    = `kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"}`
		partial = `kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"}`
	)
	webRule := `-d 10.96.0.10/32 -p tcp -m comment --comment "shop/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-67NZLRHBNDSAWJRO`
	eventually(t, 10*time.Second, "first sync", func() error {
		if slices.Contains(node.ipt4.Rules(iptables.TableNAT, iptables.KubeServicesChain), webRule) {
			return nil
		}
		return fmt.Errorf("KUBE-SERVICES holds %q", node.ipt4.Rules(iptables.TableNAT, iptables.KubeServicesChain))
	})
	if got := metric(full); got != 1 {
		t.Errorf("%d full syncs after the first, want 1", int(got))
	}
	if node.ipt6.Dump() != "" {
		t.Errorf("the IPv4-only node got IPv6 rules:\n%s", node.ipt6.Dump())
	}
	// The jump rules and the canary are in.
	if got := node.ipt4.Rules(iptables.TableNAT, iptables.ChainPrerouting); len(got) != 1 {
		t.Errorf("nat PREROUTING holds %q, want the jump to KUBE-SERVICES", got)
	}
	eventually(t, 5*time.Second, "canary", func() error {
		for _, table := range iptables.CanaryTables() {
			if node.ipt4.Rules(table, iptables.ProxyCanaryChain) == nil {
				return fmt.Errorf("no canary in %s", table)
			}
		}
		return nil
	})
	// kube-proxy's conntrack timeouts; be_liberal off keeps the INVALID rule.
	if got := readSysctl(t, node.root, "net/netfilter/nf_conntrack_tcp_timeout_established"); got != "86400" {
		t.Errorf("tcp_timeout_established = %s, want 86400", got)
	}
	if got := node.ipt4.Rules(iptables.TableFilter, iptables.KubeForwardChain); len(got) == 0 || !strings.Contains(got[0], "INVALID") {
		t.Errorf("KUBE-FORWARD = %q, want the INVALID drop first", got)
	}
	checkHTTP(t, healthURL, 200, `"healthy":true`)
	checkHTTP(t, hcURL, 200, `"localEndpoints":1`)

	// The edit: the api Service loses its endpoint on this node, dns its
	// endpoint on node-b.
	edited := editDemo(t, demo)
	// The EndpointSlice controller stamps the time of the change that
	// caused an update; network programming latency is measured from it.
	edited = strings.Replace(edited, "  name: api-1\n", "  name: api-1\n  annotations: {endpoints.kubernetes.io/last-change-trigger-time: \""+time.Now().Format(time.RFC3339Nano)+"\"}\n", 1)
	r.edit(t, edited)
	r.waitEditSynced(t, hcURL)
	if got := metric(full); got != 1 {
		t.Errorf("%d full syncs after the edit, want still 1", int(got))
	}
	if got := metric(partial); got < 1 {
		t.Errorf("%v partial syncs after the edit, want at least 1", got)
	}
	if got := metric(`kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"}`); got != 1 {
		t.Errorf("conntrack entries deleted: %v, want 1", got)
	}
	if got := metric(`kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"}`); got != 1 {
		t.Errorf("network programming latencies observed: %v, want 1 (the api slice's)", got)
	}
	if got := metric(`kubeproxy_network_programming_duration_seconds_sum{ip_family="IPv4"}`); got <= 0 || got > 10 {
		t.Errorf("network programming latency %vs, want between 0 and the 10s the test waited", got)
	}
	if got := metric(`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"}`); got != 1 {
		t.Errorf("no-local-endpoints (external): %v, want 1 (shop/api)", got)
	}

	// Another program flushes the tables: the canary is gone, and a full
	// sync puts everything back.
	for _, table := range iptables.CanaryTables() {
		for _, c := range node.ipt4.Chains(table) {
			if !c.IsBuiltin(table) {
				_ = node.ipt4.FlushChain(ctx, table, c)
			}
		}
		for _, c := range table.BuiltinChains() {
			_ = node.ipt4.FlushChain(ctx, table, c)
		}
	}
	eventually(t, 10*time.Second, "resync after a flush", func() error {
		if got := metric(full); got != 2 {
			return fmt.Errorf("%v full syncs", got)
		}
		if !slices.Contains(node.ipt4.Rules(iptables.TableNAT, iptables.KubeServicesChain), webRule) {
			return errors.New("the web rule is not back")
		}
		return nil
	})
	if got := node.ipt4.Rules(iptables.TableNAT, iptables.ChainPrerouting); len(got) != 1 {
		t.Errorf("nat PREROUTING holds %q after the resync, want the jump to KUBE-SERVICES", got)
	}

	// The kernel drifts from what the writer wrote (someone deleted the
	// web Service's rule), so the partial sync that deletes web fails;
	// the retry is a full sync and puts things right.
	if err := node.ipt4.DeleteRule(ctx, iptables.TableNAT, iptables.KubeServicesChain,
		"-d", "10.96.0.10/32", "-p", "tcp", "-m", "comment", "--comment", "shop/web:http cluster IP", "-m", "tcp", "--dport", "80", "-j", "KUBE-SVC-67NZLRHBNDSAWJRO"); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(node.ipt4.Rules(iptables.TableNAT, iptables.KubeServicesChain), webRule) {
		t.Fatal("the web rule was not deleted")
	}
	i := strings.Index(edited, "# UDP DNS")
	j := strings.Index(edited, "# ClusterIP, TCP")
	if i < 0 || j < 0 || j > i {
		t.Fatal("the demo file's layout changed")
	}
	withoutWeb := edited[:j] + edited[i:]
	r.edit(t, withoutWeb)
	eventually(t, 10*time.Second, "recovery from a failed restore", func() error {
		if got := metric(full); got != 3 {
			return fmt.Errorf("%v full syncs", got)
		}
		if node.ipt4.Rules(iptables.TableNAT, "KUBE-SVC-67NZLRHBNDSAWJRO") != nil {
			return errors.New("web's service chain is still there")
		}
		return nil
	})
	if got := metric(`kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"}`); got != 1 {
		t.Errorf("restore failures %v, want 1", got)
	}
	if got := metric(`kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total{ip_family="IPv4"}`); got != 1 {
		t.Errorf("partial restore failures %v, want 1", got)
	}

	// kube-proxy's names, and nothing missing.
	m, err := scrape(httpGet, metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, name := range []string{
		`kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="IPv4"}`,
		full, partial,
		`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`,
		`kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"}`,
		`kubeproxy_sync_proxy_rules_service_changes_total`,
		`kubeproxy_sync_proxy_rules_service_changes_pending`,
		`kubeproxy_sync_proxy_rules_endpoint_changes_total`,
		`kubeproxy_sync_proxy_rules_endpoint_changes_pending`,
		`kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"}`,
		`kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"}`,
		`kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family="IPv4"}`,
		`kubeproxy_proxy_healthz_total{code="200"}`,
		`kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv4",table="nat"}`,
		`kubeproxy_sync_proxy_rules_iptables_last{ip_family="IPv4",table="filter"}`,
		`process_start_time_seconds`,
	} {
		if _, ok := m[name]; !ok {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		t.Errorf("metrics missing: %q", missing)
	}
	if got := m[`kubeproxy_sync_proxy_rules_endpoint_changes_total`]; got < 7 {
		t.Errorf("endpoint changes total %v, want the demo's 6 slices and the edited one at least", got)
	}
	if last, queued := m[`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`], m[`kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv4"}`]; last < queued {
		t.Errorf("last sync %v before the last queued change %v, though nothing is pending", last, queued)
	}

	// Stopping leaves the rules and closes the listeners.
	rules := node.ipt4.Dump()
	r.stop(t)
	if diff := cmp.Diff(rules, node.ipt4.Dump()); diff != "" {
		t.Errorf("stopping changed the rules (-before +after):\n%s", diff)
	}
	for _, u := range []string{metricsURL, healthURL, hcURL} {
		if _, _, err := httpGet(u); err == nil {
			t.Errorf("%s still answers after the proxier stopped", u)
		}
	}
}

func checkHTTP(t *testing.T, url string, code int, body string) {
	t.Helper()
	gotCode, gotBody, err := httpGet(url)
	if err != nil || gotCode != code || !strings.Contains(gotBody, body) {
		t.Errorf("GET %s = %d %q, %v; want %d with %q", url, gotCode, gotBody, err, code, body)
	}
}

// TestNFTablesModeWithFakes runs the whole composition in nftables mode
// against knftables' Fake and the conntrack fake, on the demo cluster: the
// first sync is full, an edit is a partial sync that reaches the table,
// conntrack and the health-check node port, the table deleted by another
// program comes back with a full sync, a partial sync that fails on an
// element deleted by hand is counted and followed by a full one, and
// cancelling leaves the table.
func TestNFTablesModeWithFakes(t *testing.T) {
	node := newFakeNode(t)
	stale := conntracktest.NewFlow(conntrack.ProtocolUDP, netip.MustParseAddrPort("10.244.1.20:40000"),
		netip.MustParseAddrPort("10.96.0.53:53"), netip.MustParseAddrPort("10.244.2.53:53"))
	if err := node.ct.AddFlows(stale); err != nil {
		t.Fatal(err)
	}
	r := startOnFakes(t, node, "--mode", "nftables")
	metric := func(name string) float64 { t.Helper(); return r.metric(t, name) }
	const (
		full        = `kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"}`
		partial     = `kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"}`
		webElement  = "add element ip kube-proxy service-ips { 10.96.0.10 . tcp . 80 "
		webChainKey = "-shop/web/tcp/http"
	)
	nft := node.nft(knftables.IPv4Family, "kube-proxy")
	dump := func() string { return node.nftDump(knftables.IPv4Family, "kube-proxy") }
	eventually(t, 10*time.Second, "first sync", func() error {
		if strings.Contains(dump(), webElement) {
			return nil
		}
		return fmt.Errorf("the table holds:\n%s", dump())
	})
	if got := metric(full); got != 1 {
		t.Errorf("%v full syncs after the first, want 1", got)
	}
	if d := node.nftDump(knftables.IPv6Family, "kube-proxy"); d != "" {
		t.Errorf("the IPv4-only node got an IPv6 table:\n%s", d)
	}
	// Node ports, and so health checks, are on the node's own address,
	// as kube-proxy's nftables mode has them by default.
	hcURL := node.url(t, "192.168.10.11:32000", "/")
	checkHTTP(t, hcURL, 200, `"localEndpoints":1`)

	edited := editDemo(t, r.demo)
	r.edit(t, edited)
	r.waitEditSynced(t, hcURL)
	if got := metric(full); got != 1 {
		t.Errorf("%v full syncs after the edit, want still 1", got)
	}
	if got := metric(partial); got < 1 {
		t.Errorf("%v partial syncs after the edit, want at least 1", got)
	}
	if strings.Contains(dump(), "10.244.2.53") {
		t.Errorf("the endpoint the edit removed is still in the table:\n%s", dump())
	}

	// Another program deletes the table (nft flush ruleset): the check
	// between syncs sees it, and a full sync writes it again.
	tx := nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := nft.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "resync after the table's deletion", func() error {
		if got := metric(full); got != 2 {
			return fmt.Errorf("%v full syncs", got)
		}
		if !strings.Contains(dump(), webElement) {
			return errors.New("web's element is not back")
		}
		return nil
	})

	// web's element deleted by hand: the partial sync that deletes web
	// fails on it, and the retry is a full sync that puts things right.
	failures := metric(`kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"}`)
	tx = nft.NewTransaction()
	tx.Delete(&knftables.Element{Map: "service-ips", Key: []string{"10.96.0.10", "tcp", "80"}})
	if err := nft.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	i, j := strings.Index(edited, "# UDP DNS"), strings.Index(edited, "# ClusterIP, TCP")
	if i < 0 || j < 0 || j > i {
		t.Fatal("the demo file's layout changed")
	}
	r.edit(t, edited[:j]+edited[i:])
	eventually(t, 10*time.Second, "recovery from a failed transaction", func() error {
		if got := metric(full); got != 3 {
			return fmt.Errorf("%v full syncs", got)
		}
		if strings.Contains(dump(), webElement) || strings.Contains(dump(), webChainKey) {
			return errors.New("web's element or chains are still there")
		}
		return nil
	})
	if got := metric(`kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"}`); got != failures+1 {
		t.Errorf("sync failures %v, want %v", got, failures+1)
	}
	r.stop(t)
	if !strings.Contains(dump(), "add table ip kube-proxy") {
		t.Error("the table went with the proxier")
	}
}
