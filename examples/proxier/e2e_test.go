package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/iptables"
)

// The end-to-end tests run the built proxier in a node network namespace,
// against a manifest directory the test edits, between a client namespace
// and pod namespaces on a bridge, and check what real packets do.
//
//	client 10.1.0.2, 10.1.0.3 ── 10.1.0.1 node (proxier) 10.244.0.1 ── br0 ── pod-a 10.244.0.11 (node-a)
//	                                                                        ├─ pod-b 10.244.0.12 (says node-b)
//	                                                                        └─ pod-c 10.244.0.13 (node-a)
const (
	e2eNodeIP      = "10.1.0.1"
	e2eClientIP    = "10.1.0.2"
	e2eOtherClient = "10.1.0.3"
	e2eBridgeIP    = "10.244.0.1"
	e2eClusterCIDR = "10.244.0.0/16"
	e2ePodPort     = 8080
	e2eNS          = "e2e"
	e2eSyncPeriod  = 2 * time.Second
)

// e2ePod is a pod namespace with a backend answering with its name.
type e2ePod struct {
	name, ip, ip6, node string
}

var e2ePods = []e2ePod{
	{"pod-a", "10.244.0.11", "fd00:244::11", "node-a"},
	{"pod-b", "10.244.0.12", "fd00:244::12", "node-b"},
	{"pod-c", "10.244.0.13", "fd00:244::13", "node-a"},
}

// e2eService is a Service of the test cluster and its EndpointSlices: one
// of each address type whose pods are not nil.
type e2eService struct {
	name string
	// spec is the Service's spec (and status), as YAML lines indented by
	// two spaces.
	spec string
	// ports are the slices' ports, as a YAML flow sequence.
	ports string
	// pods and pods6 are the endpoints of the IPv4 and the IPv6 slice,
	// by pod name.
	pods, pods6 []string
	// trigger, when set, is the slices' last-change-trigger-time.
	trigger time.Time
}

// e2eCluster renders the manifest file.
type e2eCluster struct {
	node     string
	services []e2eService
}

func (c *e2eCluster) service(name string) *e2eService {
	for i := range c.services {
		if c.services[i].name == name {
			return &c.services[i]
		}
	}
	panic("no service " + name)
}

func (c *e2eCluster) delete(name string) {
	c.services = slices.DeleteFunc(c.services, func(s e2eService) bool { return s.name == name })
}

func (c *e2eCluster) render() []byte {
	var b bytes.Buffer
	b.WriteString(c.node)
	for _, s := range c.services {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: %s}\nspec:\n%s", s.name, e2eNS, s.spec)
		if s.pods != nil {
			s.renderSlice(&b, "IPv4", s.pods)
		}
		if s.pods6 != nil {
			s.renderSlice(&b, "IPv6", s.pods6)
		}
	}
	return b.Bytes()
}

func (s *e2eService) renderSlice(b *bytes.Buffer, addressType string, pods []string) {
	fmt.Fprintf(b, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: %s-%s\n  namespace: %s\n  labels: {kubernetes.io/service-name: %s}\n",
		s.name, strings.ToLower(addressType), e2eNS, s.name)
	if !s.trigger.IsZero() {
		fmt.Fprintf(b, "  annotations: {endpoints.kubernetes.io/last-change-trigger-time: %q}\n", s.trigger.Format(time.RFC3339Nano))
	}
	fmt.Fprintf(b, "addressType: %s\nports: %s\nendpoints:", addressType, s.ports)
	if len(pods) == 0 {
		b.WriteString(" []")
	}
	b.WriteString("\n")
	for _, name := range pods {
		for _, p := range e2ePods {
			if p.name != name {
				continue
			}
			ip := p.ip
			if addressType == "IPv6" {
				ip = p.ip6
			}
			fmt.Fprintf(b, "- {addresses: [%q], nodeName: %s, conditions: {ready: true}}\n", ip, p.node)
		}
	}
}

const (
	e2eTCP    = "[{name: http, port: 8080, protocol: TCP}]"
	e2eTCPUDP = "[{name: tcp, port: 8080, protocol: TCP}, {name: udp, port: 8080, protocol: UDP}]"
)

func e2eClusterIP(ip string, extra ...string) string {
	s := fmt.Sprintf("  clusterIP: %s\n  clusterIPs: [%s]\n  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]\n", ip, ip)
	for _, e := range extra {
		s += "  " + e + "\n"
	}
	return s
}

// e2eScenario is the cluster of TestE2E before any change.
func e2eScenario() *e2eCluster {
	ab := []string{"pod-a", "pod-b"}
	return &e2eCluster{
		node: "apiVersion: v1\nkind: Node\nmetadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-a}}\nstatus: {addresses: [{type: InternalIP, address: " + e2eNodeIP + "}]}\n",
		services: []e2eService{
			{name: "web", ports: e2eTCPUDP, pods: ab,
				spec: "  clusterIP: 10.96.0.10\n  clusterIPs: [10.96.0.10]\n  ports: [{name: tcp, port: 80, targetPort: 8080, protocol: TCP}, {name: udp, port: 80, targetPort: 8080, protocol: UDP}]\n"},
			{name: "np", ports: e2eTCP, pods: ab,
				spec: "  type: NodePort\n  clusterIP: 10.96.0.11\n  clusterIPs: [10.96.0.11]\n  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080, protocol: TCP}]\n"},
			{name: "ext", ports: e2eTCP, pods: ab, spec: e2eClusterIP("10.96.0.12", "externalIPs: [192.0.2.10]")},
			{name: "lb", ports: e2eTCP, pods: ab,
				spec: "  type: LoadBalancer\n  clusterIP: 10.96.0.13\n  clusterIPs: [10.96.0.13]\n  loadBalancerSourceRanges: [" + e2eClientIP + "/32]\n" +
					"  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30083, protocol: TCP}]\nstatus: {loadBalancer: {ingress: [{ip: 203.0.113.5}]}}\n"},
			{name: "sticky", ports: e2eTCP, pods: ab, spec: e2eClusterIP("10.96.0.14", "sessionAffinity: ClientIP")},
			{name: "local", ports: e2eTCP, pods: ab,
				spec: "  type: LoadBalancer\n  clusterIP: 10.96.0.15\n  clusterIPs: [10.96.0.15]\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 30185\n" +
					"  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30085, protocol: TCP}]\nstatus: {loadBalancer: {ingress: [{ip: 203.0.113.15}]}}\n"},
			{name: "itp", ports: e2eTCP, pods: ab, spec: e2eClusterIP("10.96.0.16", "internalTrafficPolicy: Local")},
			{name: "empty",
				spec: "  clusterIP: 10.96.0.17\n  clusterIPs: [10.96.0.17]\n  ports: [{name: tcp, port: 80, protocol: TCP}, {name: udp, port: 80, protocol: UDP}]\n"},
			{name: "victim", ports: e2eTCP, pods: []string{"pod-c"}, spec: e2eClusterIP("10.96.0.18")},
		},
	}
}

// e2eMode is how an end-to-end test's proxier programs the node.
type e2eMode struct {
	// name names the subtest: the iptables backend in iptables mode,
	// "nftables" in nftables mode.
	name string
	// mode is --mode.
	mode string
	// backend is the iptables backend iptables mode must pick (the test
	// marks it with the kubelet's hint chain), and the one the test adds
	// other programs' rules with in nftables mode.
	backend iptables.Backend
}

// e2eModes are the modes every end-to-end scenario runs in: iptables mode
// on each iptables backend, and nftables mode.
var e2eModes = []e2eMode{
	{"legacy", modeIPTables, iptables.BackendLegacy},
	{"nft", modeIPTables, iptables.BackendNFT},
	{"nftables", modeNFTables, iptables.BackendNFT},
}

// nftables reports whether the mode writes nftables mode's tables:
// nftables mode, and ebpf mode beside its socket load balancer.
func (m e2eMode) nftables() bool { return m.mode == modeNFTables || m.mode == modeEBPF }

// tools are the programs the mode's tests run, with IPv6's when ipv6 is
// set.
func (m e2eMode) tools(ipv6 bool) []string {
	tools := e2eTools(m.backend)
	if ipv6 && m.mode == modeIPTables {
		b := string(m.backend)
		tools = append(tools, "ip6tables-"+b, "ip6tables-"+b+"-save", "ip6tables-"+b+"-restore")
	}
	if m.nftables() {
		tools = append(tools, "nft")
	}
	return tools
}

// forEachE2EMode runs test in a subtest per mode, each skipped (or failed,
// with PROXYKIT_REQUIRE_KERNEL=1) where its tools are missing.
func forEachE2EMode(t *testing.T, ipv6 bool, test func(t *testing.T, m e2eMode)) {
	for _, m := range e2eModes {
		t.Run(m.name, func(t *testing.T) {
			kerneltest.Require(t, m.tools(ipv6)...)
			test(t, m)
		})
	}
}

// newE2EModeNode is newE2ENode for a proxier in mode m.
func newE2EModeNode(t *testing.T, m e2eMode, cluster *e2eCluster, ipv6 bool) *e2eNode {
	if m.nftables() {
		// nftables mode writes most services as map elements alone;
		// one with ClientIP affinity keeps chains of its own (service-
		// and endpoint-), which the tests of faults in chains need.
		for i := range cluster.services {
			if s := &cluster.services[i]; s.name == "victim" {
				s.spec += "  sessionAffinity: ClientIP\n"
			}
		}
	}
	k := newE2ENode(t, m.backend, cluster, ipv6)
	k.mode = m.mode
	if m.mode == modeEBPF {
		k.extraArgs, k.cgroup, k.bpffs = ebpfE2EArgs(t)
	}
	return k
}

// ebpfE2EArgs mounts a cgroup2 hierarchy and a bpffs of the test's own,
// makes the cgroup ebpf mode attaches to, and returns the flags that
// give them to the proxier, the cgroup and the bpffs.
func ebpfE2EArgs(t *testing.T) (args []string, cgroup, bpffs string) {
	cgRoot, bpffs := kerneltest.MountCgroupAndBPF(t)
	cgroup = filepath.Join(cgRoot, "proxykit-e2e-clients")
	if err := os.Mkdir(cgroup, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(cgroup) })
	return []string{"--ebpf-cgroup-path", cgroup, "--ebpf-pin-path", bpffs, "--ebpf-name-prefix", "e2e"}, cgroup, bpffs
}

// e2eNode is the test's world around one proxier.
type e2eNode struct {
	t       testing.TB
	backend iptables.Backend
	// mode, when set, is given to the proxier as --mode.
	mode string
	// extraArgs are given to every run of the proxier (ebpf mode's
	// cgroup and pins).
	extraArgs []string
	// cgroup and bpffs are ebpf mode's cgroup and pin path.
	cgroup, bpffs string
	node, client  *kerneltest.NS
	pods          map[string]*kerneltest.NS
	dir           string
	lockFile      string
	cluster       *e2eCluster
	proc          *exec.Cmd
	log           *logBuffer
	exited        chan error
}

func e2eTools(b iptables.Backend) []string {
	s := string(b)
	return []string{"iptables-" + s, "iptables-" + s + "-save", "iptables-" + s + "-restore"}
}

// newE2ENode builds the namespaces and the manifest directory; ipv6 adds
// IPv6 addresses everywhere. backend is the one the proxier must pick: the
// test marks it as the kubelet does, with the KUBE-IPTABLES-HINT chain.
func newE2ENode(t testing.TB, backend iptables.Backend, cluster *e2eCluster, ipv6 bool) *e2eNode {
	t.Helper()
	k := &e2eNode{t: t, backend: backend, dir: t.TempDir(), cluster: cluster, log: &logBuffer{}}
	k.lockFile = filepath.Join(t.TempDir(), "xtables.lock")
	cfg := kerneltest.ProxyNetworkConfig{
		ClientAddrs: []netip.Prefix{prefix(e2eClientIP + "/24"), prefix(e2eOtherClient + "/24")},
		NodeAddrs:   []netip.Prefix{prefix(e2eNodeIP + "/24")},
		BridgeAddrs: []netip.Prefix{prefix(e2eBridgeIP + "/24")},
		BackendPort: e2ePodPort,
	}
	if ipv6 {
		cfg.ClientAddrs = append(cfg.ClientAddrs, prefix("fd00:1::2/64"))
		cfg.NodeAddrs = append(cfg.NodeAddrs, prefix("fd00:1::1/64"))
		cfg.BridgeAddrs = append(cfg.BridgeAddrs, prefix("fd00:244::1/64"))
	}
	for _, p := range e2ePods {
		pod := kerneltest.NetworkPod{Name: p.name, Addrs: []netip.Prefix{prefix(p.ip + "/24")}}
		if ipv6 {
			pod.Addrs = append(pod.Addrs, prefix(p.ip6+"/64"))
		}
		cfg.Pods = append(cfg.Pods, pod)
	}
	nw := kerneltest.NewProxyNetwork(t, cfg)
	k.node, k.client, k.pods = nw.Node, nw.Client, nw.Pods
	k.iptables(t, v1.IPv4Protocol, "-t", "mangle", "-N", "KUBE-IPTABLES-HINT")
	k.writeManifest()
	return k
}

func prefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// writeManifest writes the cluster to the manifest directory in one
// rename, so that the proxier never reads half a file.
func (k *e2eNode) writeManifest() {
	k.t.Helper()
	tmp := filepath.Join(k.dir, ".cluster.yaml.tmp")
	if err := os.WriteFile(tmp, k.cluster.render(), 0o644); err != nil {
		k.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(k.dir, "cluster.yaml")); err != nil {
		k.t.Fatal(err)
	}
}

// iptables runs the real iptables binary of the test's backend in the
// node, with the proxier's xtables lock.
func (k *e2eNode) iptables(t testing.TB, p v1.IPFamily, args ...string) string {
	t.Helper()
	name := "iptables-" + string(k.backend)
	if p == v1.IPv6Protocol {
		name = "ip6tables-" + string(k.backend)
	}
	var stdout, stderr bytes.Buffer
	err := k.node.Do(func() error {
		cmd := exec.Command(name, args...)
		cmd.Env = append(os.Environ(), "XTABLES_LOCKFILE="+k.lockFile)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		return cmd.Run()
	})
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// proxierArgs are the flags every end-to-end run uses. The drift check is
// off unless extra turns it on: firing while a test breaks rules on
// purpose, it would repair them before the test's own sync meets them.
func (k *e2eNode) proxierArgs(extra ...string) []string {
	if k.mode != "" {
		extra = append(append([]string{"--mode", k.mode}, k.extraArgs...), extra...)
	}
	return append([]string{"--manifests", k.dir, "--hostname-override", "node-a", "--cluster-cidr", e2eClusterCIDR,
		"--sync-period", e2eSyncPeriod.String(), "--min-sync-period", "100ms", "--iptables-drift-check-period", "0",
		"--healthz-bind-address", e2eNodeIP + ":10256", "--metrics-bind-address", e2eNodeIP + ":10249", "-v", "2"}, extra...)
}

// runProxier runs the built proxier in the node until it exits, and
// returns its error.
func (k *e2eNode) runProxier(args ...string) error {
	k.t.Helper()
	cmd := exec.Command(proxierBinary(k.t), args...)
	cmd.Env = append(os.Environ(), "XTABLES_LOCKFILE="+k.lockFile)
	cmd.Stdout, cmd.Stderr = k.log, k.log
	return k.node.Do(cmd.Run)
}

// start starts the proxier in the node and waits until its first sync is
// in and /healthz says so.
func (k *e2eNode) start(args ...string) {
	t := k.t
	t.Helper()
	k.proc = exec.Command(proxierBinary(t), args...)
	k.proc.Env = append(os.Environ(), "XTABLES_LOCKFILE="+k.lockFile)
	k.proc.Stdout, k.proc.Stderr = k.log, k.log
	if err := k.node.Do(k.proc.Start); err != nil {
		t.Fatal(err)
	}
	k.exited = make(chan error, 1)
	go func() { k.exited <- k.proc.Wait() }()
	t.Cleanup(func() {
		_ = k.proc.Process.Kill()
		<-k.exited
		if t.Failed() || os.Getenv("E2E_LOG") != "" {
			t.Logf("proxier log:\n%s", k.log.String())
		}
	})
	k.eventually(15*time.Second, "the proxier's first sync", func() error {
		code, body, err := k.get("http://" + e2eNodeIP + ":10256/healthz")
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("/healthz: %d %s %v", code, body, err)
		}
		if n := k.metric(`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"}`); n < 1 {
			return errors.New("no full sync yet")
		}
		return nil
	})
	if k.mode == modeNFTables || k.mode == modeEBPF {
		// In ebpf mode the family's other group (the socket load
		// balancer) may be the one whose sync the metric counted.
		k.eventually(5*time.Second, "nftables mode's first sync", func() error {
			if out, err := k.node.Exec("nft", "list", "map", "ip", "kube-proxy", "service-ips"); err != nil || !strings.Contains(out, " . tcp . ") {
				return fmt.Errorf("the table holds no service: %v\n%s", err, out)
			}
			return nil
		})
		return
	}
	save := k.iptables(t, v1.IPv4Protocol, "-t", "nat", "-S", "KUBE-SERVICES")
	if !strings.Contains(save, "-A KUBE-SERVICES") {
		t.Fatalf("the %s backend holds no service rules; the proxier picked the wrong one:\n%s", k.backend, save)
	}
}

// nft runs the real nft in the node.
func (k *e2eNode) nft(t testing.TB, args ...string) string {
	t.Helper()
	return k.node.MustExec(t, "nft", args...)
}

// nftChains returns the names of the chains in nftables mode's IPv4 table.
func (k *e2eNode) nftChains(t testing.TB) []string {
	t.Helper()
	var chains []string
	table := ""
	for line := range strings.Lines(k.nft(t, "list", "chains", "ip")) {
		switch f := strings.Fields(line); {
		case len(f) == 4 && f[0] == "table":
			table = f[2]
		case len(f) == 3 && f[0] == "chain" && f[2] == "{" && table == "kube-proxy":
			chains = append(chains, f[1])
		}
	}
	return chains
}

// nftChainOf returns the name of the chain of the nftables table whose
// name holds part, or fails t.
func (k *e2eNode) nftChainOf(t testing.TB, prefix, part string) string {
	t.Helper()
	chains := k.nftChains(t)
	for _, c := range chains {
		if strings.HasPrefix(c, prefix) && strings.Contains(c, part) {
			return c
		}
	}
	t.Fatalf("no chain %s*%s* in %v", prefix, part, chains)
	return ""
}

// syncFailures is the metric that counts the mode's failed applies.
func (k *e2eNode) syncFailures() string {
	if k.mode == modeNFTables || k.mode == modeEBPF {
		return nftSyncFails
	}
	return restoreFails
}

// eventually polls check every 100ms until it returns nil, and fails the
// test with its last error after timeout.
func (k *e2eNode) eventually(timeout time.Duration, what string, check func() error) {
	k.t.Helper()
	select {
	case err := <-k.exited:
		k.t.Fatalf("%s: the proxier exited: %v", what, err)
	default:
	}
	eventually(k.t, timeout, what, check)
}

// get is an HTTP GET from the client namespace.
func (k *e2eNode) get(url string) (int, string, error) {
	tr := &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := k.client.Do(func() error {
				var err error
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}
	defer tr.CloseIdleConnections()
	c := http.Client{Transport: tr, Timeout: 3 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// metric returns a sample of the proxier's /metrics (0 when absent).
func (k *e2eNode) metric(name string) float64 {
	k.t.Helper()
	m, err := scrape(k.get, "http://"+e2eNodeIP+":10249/metrics")
	if err != nil {
		k.t.Fatal(err)
	}
	return m[name]
}

func (k *e2eNode) dial(network, from, to string, port int, timeout time.Duration) (kerneltest.Reply, error) {
	return kerneltest.DialFrom(k.client, network, netip.MustParseAddr(from), netip.AddrPortFrom(netip.MustParseAddr(to), uint16(port)), timeout)
}

// spread makes n connections from the client to to:port and counts the
// backends that answered; an error is returned at the first failure.
func (k *e2eNode) spread(network, to string, port, n int) (map[string]int, error) {
	got := map[string]int{}
	for range n {
		r, err := k.dial(network, e2eClientIP, to, port, 2*time.Second)
		if err != nil {
			return got, err
		}
		got[r.Name]++
	}
	return got, nil
}

// reaches checks that n connections to to:port reach exactly the backends
// want, each of them at least once.
func (k *e2eNode) reaches(network, to string, port, n int, want ...string) error {
	got, err := k.spread(network, to, port, n)
	if err != nil {
		return err
	}
	var names []string
	for name := range got {
		names = append(names, name)
	}
	slices.Sort(names)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		return fmt.Errorf("%s to %s:%d: %d connections reached %v, want each of %v", network, to, port, n, got, want)
	}
	return nil
}

// refused checks that a connection is refused at once.
func (k *e2eNode) refused(network, from, to string, port int) error {
	start := time.Now()
	r, err := k.dial(network, from, to, port, 2*time.Second)
	switch {
	case err == nil:
		return fmt.Errorf("%s from %s to %s:%d reached %s, want refused", network, from, to, port, r.Name)
	case !errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("%s from %s to %s:%d: %v, want connection refused", network, from, to, port, err)
	case time.Since(start) > time.Second:
		return fmt.Errorf("%s from %s to %s:%d refused only after %v", network, from, to, port, time.Since(start))
	}
	return nil
}

// unanswered checks that a connection gets no answer.
func (k *e2eNode) unanswered(network, from, to string, port int) error {
	r, err := k.dial(network, from, to, port, 500*time.Millisecond)
	if err == nil {
		return fmt.Errorf("%s from %s to %s:%d reached %s, want no answer", network, from, to, port, r.Name)
	}
	if !kerneltest.IsTimeout(err) {
		return fmt.Errorf("%s from %s to %s:%d: %v, want a timeout", network, from, to, port, err)
	}
	return nil
}

func check(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Error(err)
	}
}

// TestE2E runs the proxier in iptables mode on each iptables backend, and
// in nftables mode, through its scenarios: every kind of
// service, churn, faults, health and shutdown.
func TestE2E(t *testing.T) {
	forEachE2EMode(t, false, testE2E)
}

const (
	fullSyncs    = `kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"}`
	partialSyncs = `kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"}`
	restoreFails = `kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"}`
	nftSyncFails = `kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"}`
	nftCleanFail = `kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total{ip_family="IPv4"}`
)

func testE2E(t *testing.T, m e2eMode) {
	k := newE2EModeNode(t, m, e2eScenario(), false)
	k.start(k.proxierArgs()...)
	fulls := k.metric(fullSyncs)

	t.Run("services", func(t *testing.T) { k.checkServices(t, randomCounts) })

	t.Run("hairpin", func(t *testing.T) {
		// pod-a reaches its own service (internalTrafficPolicy Local:
		// pod-a is its only endpoint here), and sees the connection
		// come from the node's bridge address: masqueraded, or its reply
		// would go straight back to itself and be dropped.
		r, err := kerneltest.Dial(k.pods["pod-a"], "tcp", netip.MustParseAddrPort("10.96.0.16:80"), 2*time.Second)
		if err != nil || r.Name != "pod-a" || r.Client != netip.MustParseAddr(e2eBridgeIP) {
			t.Errorf("pod-a to its own service: reached %q seeing client %v (%v); want pod-a seeing %s", r.Name, r.Client, err, e2eBridgeIP)
		}
	})

	t.Run("churn", func(t *testing.T) {
		partials := k.metric(partialSyncs)
		k.churn(t, randomCounts, true)

		// The Local service loses its endpoint on this node: the
		// health-check node port says so, and external traffic is dropped.
		k.cluster.service("local").pods = []string{"pod-b"}
		k.writeManifest()
		k.eventually(e2eChange, "health check without local endpoints", func() error {
			return expectGet(k, "http://"+e2eNodeIP+":30185/", 503, `"localEndpoints":0`)
		})
		if m.mode == modeEBPF {
			// The health check follows whichever of the family's two
			// groups synced first; nftables' may come a moment later.
			k.eventually(e2eChange, "external traffic dropped", func() error {
				return k.unanswered("tcp", e2eClientIP, e2eNodeIP, 30085)
			})
		} else {
			check(t, k.unanswered("tcp", e2eClientIP, e2eNodeIP, 30085))
		}
		k.cluster.service("local").pods = []string{"pod-a", "pod-b"}
		k.writeManifest()
		k.eventually(5*time.Second, "health check with a local endpoint again", func() error {
			return expectGet(k, "http://"+e2eNodeIP+":30185/", 200, `"localEndpoints":1`)
		})
		check(t, k.reaches("tcp", e2eNodeIP, 30085, 10, "pod-a"))

		if got := k.metric(fullSyncs); got != fulls {
			t.Errorf("%v full syncs after the churn, want still %v: every change should sync partially", got, fulls)
		}
		if got := k.metric(partialSyncs); got < partials+6 {
			t.Errorf("%v partial syncs after six changes, had %v before", got, partials)
		}
	})

	t.Run("flushed by another program", func(t *testing.T) {
		// A firewall reload: every table emptied, the canary with it;
		// in nftables mode, the whole ruleset flushed, as the
		// nftables service's reload does, the proxier's table with it.
		if m.nftables() {
			k.nft(t, "flush", "ruleset")
		} else {
			for _, table := range []string{"mangle", "nat", "filter"} {
				k.iptables(t, v1.IPv4Protocol, "-t", table, "-F")
				k.iptables(t, v1.IPv4Protocol, "-t", table, "-X")
			}
		}
		// Whether traffic fails in between depends on how soon the
		// canary (the table check) runs; the full sync count shows the
		// resync.
		k.eventually(e2eSyncPeriod+10*time.Second, "rules restored", func() error {
			return k.reaches("tcp", "10.96.0.10", 80, 20, "pod-a", "pod-b", "pod-c")
		})
		if got := k.metric(fullSyncs); got != fulls+1 {
			t.Errorf("%v full syncs after the flush, want %v", got, fulls+1)
		}
		fulls = k.metric(fullSyncs)
		check(t, k.reaches("tcp", "203.0.113.5", 80, 10, "pod-a", "pod-b"))
		check(t, k.refused("tcp", e2eClientIP, "10.96.0.17", 80))
	})

	t.Run("failed restore", func(t *testing.T) {
		// Someone deletes victim's rule (in nftables mode its element of
		// the service-ips map); the partial sync that deletes the victim
		// Service then fails on it, and the retry is full. In nftables
		// mode the drift watcher sees the deletion as it is committed and
		// may repair the element first; then the deletion of victim
		// succeeds at once, with no failure and no full sync.
		failures, cleanups := k.metric(k.syncFailures()), k.metric(nftCleanFail)
		logStart := len(k.log.String())
		var victimChains []string
		if m.nftables() {
			for _, c := range k.nftChains(t) {
				if strings.Contains(c, "-e2e/victim/tcp/http") {
					victimChains = append(victimChains, c)
				}
			}
			k.nft(t, "delete", "element", "ip", "kube-proxy", "service-ips", "{", "10.96.0.18", ".", "tcp", ".", "80", "}")
		} else {
			k.deleteRule(t, "KUBE-SERVICES", "e2e/victim:http cluster IP")
		}
		k.cluster.delete("victim")
		k.writeManifest()
		// repairedFirst: nftables mode's drift repair restored the element
		// before the sync that deletes victim ran, so nothing failed.
		repairedFirst := false
		k.eventually(e2eSyncPeriod+10*time.Second, "recovery", func() error {
			if m.nftables() && k.metric(k.syncFailures()) == failures {
				for _, c := range k.nftChains(t) {
					if slices.Contains(victimChains, c) {
						return fmt.Errorf("victim's chain %s is still there", c)
					}
				}
				repairedFirst = strings.Contains(k.log.String()[logStart:], "Another program may have changed the nftables table")
				if !repairedFirst {
					return fmt.Errorf("no sync failure and no drift repair logged")
				}
				return nil
			}
			if got := k.metric(fullSyncs); got != fulls+1 {
				return fmt.Errorf("%v full syncs, want %v", got, fulls+1)
			}
			return nil
		})
		wantFailures, wantFulls := failures+1, fulls+1
		if repairedFirst {
			wantFailures, wantFulls = failures, fulls
		}
		if got := k.metric(k.syncFailures()); got != wantFailures {
			t.Errorf("%v restore failures, want %v", got, wantFailures)
		}
		if got := k.metric(fullSyncs); got != wantFulls {
			t.Errorf("%v full syncs, want %v", got, wantFulls)
		}
		if m.nftables() {
			// The failed transaction, if any, was deleting victim's chains.
			if got, want := k.metric(nftCleanFail), cleanups+wantFailures-failures; got != want {
				t.Errorf("%v cleanup failures, want %v", got, want)
			}
			if len(victimChains) < 2 {
				t.Errorf("victim had chains %v, want its service and endpoint chains", victimChains)
			}
			for _, c := range k.nftChains(t) {
				if slices.Contains(victimChains, c) {
					t.Errorf("victim's chain %s is still there", c)
				}
			}
		} else {
			victim := iptables.DefaultChainNames().ServiceCluster(portName("victim", "http"))
			if strings.Contains(k.iptables(t, v1.IPv4Protocol, "-t", "nat", "-S"), string(victim)) {
				t.Errorf("victim's chain %s is still there", victim)
			}
		}
		check(t, k.reaches("tcp", "10.96.0.20", 80, 5, "pod-c"))
		fulls = k.metric(fullSyncs)
	})

	t.Run("stalled syncs", func(t *testing.T) {
		// Another program's rule jumps to a chain the proxier must
		// delete: every sync fails until it goes, and /healthz says so.
		// In nftables mode a jump stays within a table, so the other
		// program's chain is in the proxier's table, where the drift
		// repair deletes it as foreign: the syncs do not stall.
		if m.nftables() {
			// With affinity, added has a chain to jump to.
			k.cluster.service("added").spec += "  sessionAffinity: ClientIP\n"
			k.writeManifest()
			k.eventually(e2eChange, "added's chain", func() error {
				for _, c := range k.nftChains(t) {
					if strings.HasPrefix(c, "service-") && strings.Contains(c, "-e2e/added/tcp/http") {
						return nil
					}
				}
				return errors.New("not yet")
			})
			added := k.nftChainOf(t, "service-", "-e2e/added/tcp/http")
			// One transaction: the drift repair may delete the chain
			// between two nft commands, before the rule is in it.
			k.nft(t, "add", "chain", "ip", "kube-proxy", "e2e-user", ";", "add", "rule", "ip", "kube-proxy", "e2e-user", "jump", added)
		} else {
			added := iptables.DefaultChainNames().ServiceCluster(portName("added", "http"))
			k.iptables(t, v1.IPv4Protocol, "-t", "nat", "-N", "E2E-USER")
			k.iptables(t, v1.IPv4Protocol, "-t", "nat", "-A", "E2E-USER", "-j", string(added))
		}
		failures := k.metric(k.syncFailures())
		k.cluster.delete("added")
		k.writeManifest()
		if m.nftables() {
			k.eventually(2*e2eSyncPeriod+10*time.Second, "the foreign chain removed and added deleted", func() error {
				for _, c := range k.nftChains(t) {
					if c == "e2e-user" || strings.Contains(c, "-e2e/added/tcp/http") {
						return fmt.Errorf("chain %s is still there", c)
					}
				}
				return nil
			})
			check(t, expectGet(k, "http://"+e2eNodeIP+":10256/healthz", 200, `"healthy":true`))
			check(t, k.unanswered("tcp", e2eClientIP, "10.96.0.20", 80))
			check(t, k.reaches("tcp", "10.96.0.10", 80, 20, "pod-a", "pod-b", "pod-c"))
			return
		}
		k.eventually(2*e2eSyncPeriod+10*time.Second, "/healthz failing", func() error {
			return expectGet(k, "http://"+e2eNodeIP+":10256/healthz", 503, `"healthy":false`)
		})
		if got := k.metric(k.syncFailures()); got < failures+2 {
			t.Errorf("%v restore failures, want at least %v: the syncs should keep failing", got, failures+2)
		}
		k.iptables(t, v1.IPv4Protocol, "-t", "nat", "-F", "E2E-USER")
		k.iptables(t, v1.IPv4Protocol, "-t", "nat", "-X", "E2E-USER")
		k.eventually(e2eSyncPeriod+10*time.Second, "/healthz recovering", func() error {
			return expectGet(k, "http://"+e2eNodeIP+":10256/healthz", 200, `"healthy":true`)
		})
		check(t, k.unanswered("tcp", e2eClientIP, "10.96.0.20", 80))
		check(t, k.reaches("tcp", "10.96.0.10", 80, 20, "pod-a", "pod-b", "pod-c"))
	})

	t.Run("network programming latency", func(t *testing.T) {
		// Once in ebpf mode too, where the family's two groups each
		// apply the change.
		const observations = 1.0
		count := `kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"}`
		before := k.metric(count)
		web := k.cluster.service("web")
		web.pods, web.trigger = []string{"pod-b"}, time.Now()
		k.writeManifest()
		k.eventually(5*time.Second, "the change applied", func() error { return k.reaches("tcp", "10.96.0.10", 80, 10, "pod-b") })
		k.eventually(5*time.Second, "the latency observed", func() error {
			if got := k.metric(count); got != before+observations {
				return fmt.Errorf("%v latencies observed, want %v", got, before+observations)
			}
			return nil
		})
	})

	t.Run("SIGTERM", func(t *testing.T) {
		k.terminate(t)
		// Rules stay.
		check(t, k.reaches("tcp", "10.96.0.10", 80, 10, "pod-b"))
	})
}

// terminate sends the proxier SIGTERM and checks that it exits with
// status 0 and closes its listeners.
func (k *e2eNode) terminate(t *testing.T) {
	t.Helper()
	if err := k.proc.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-k.exited:
		if err != nil {
			t.Errorf("the proxier exited with %v after SIGTERM, want status 0", err)
		}
		k.exited <- err // for the cleanup
	case <-time.After(e2eChange):
		t.Fatalf("the proxier did not exit within %v of SIGTERM", e2eChange)
	}
	if _, _, err := k.get("http://" + e2eNodeIP + ":10256/healthz"); err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("/healthz after exit: %v, want connection refused", err)
	}
}

// udpFlowTo opens UDP sockets from the client to dst until one is answered
// by backend want, and returns it, closed when the test ends.
func (k *e2eNode) udpFlowTo(t *testing.T, dst, want string) net.Conn {
	t.Helper()
	for range 30 {
		var c net.Conn
		if err := k.client.Do(func() (err error) {
			c, err = net.Dial("udp", dst)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if udpAsk(c) == want {
			t.Cleanup(func() { c.Close() })
			return c
		}
		c.Close()
	}
	t.Fatalf("no UDP flow to %s reached %s in 30 tries", dst, want)
	return nil
}

// udpAsk sends a datagram on c and returns the name of the backend that
// answers, or "" if none does within a second.
func udpAsk(c net.Conn) string {
	if err := c.SetDeadline(time.Now().Add(time.Second)); err != nil {
		return ""
	}
	if _, err := c.Write([]byte("hello\n")); err != nil {
		return ""
	}
	buf := make([]byte, 256)
	n, err := c.Read(buf)
	if err != nil {
		return ""
	}
	name, _, _ := strings.Cut(string(buf[:n]), " ")
	return name
}

func portName(svc, port string) changetracker.ServicePortName {
	return changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: e2eNS, Name: svc}, Port: port, Protocol: v1.ProtocolTCP}
}

// deleteRule deletes, with the real iptables, the rule of nat chain whose
// comment is comment.
func (k *e2eNode) deleteRule(t *testing.T, chain, comment string) {
	t.Helper()
	n := 0
	for line := range strings.Lines(k.iptables(t, v1.IPv4Protocol, "-t", "nat", "-S", chain)) {
		if !strings.HasPrefix(line, "-A ") {
			continue
		}
		n++
		if strings.Contains(line, `"`+comment+`"`) {
			k.iptables(t, v1.IPv4Protocol, "-t", "nat", "-D", chain, fmt.Sprint(n))
			return
		}
	}
	t.Fatalf("no rule with comment %q in %s", comment, chain)
}

func expectGet(k *e2eNode, url string, code int, body string) error {
	gotCode, gotBody, err := k.get(url)
	if err != nil || gotCode != code || !strings.Contains(gotBody, body) {
		return fmt.Errorf("GET %s = %d %q, %v; want %d with %q", url, gotCode, gotBody, err, code, body)
	}
	return nil
}

func checkGet(t *testing.T, k *e2eNode, url string, code int, body string) {
	t.Helper()
	check(t, expectGet(k, url, code, body))
}

// e2eCounts are how many connections a check makes to reach each of one,
// two or three backends at least once: iptables mode picks a backend at
// random, and misses one of two in 30 tries with a chance of one in half a
// billion; IPVS's round robin takes them in turn.
type e2eCounts struct{ one, two, three int }

var (
	randomCounts     = e2eCounts{one: 20, two: 30, three: 40}
	roundRobinCounts = e2eCounts{one: 4, two: 6, three: 9}
)

// e2eChange bounds the time from an edit of the manifest to traffic
// following it: generous, for the emulated VM.
const e2eChange = 10 * time.Second

// checkServices checks every kind of service of e2eScenario, as it is
// before any change, from the client.
func (k *e2eNode) checkServices(t *testing.T, n e2eCounts) {
	check(t, k.reaches("tcp", "10.96.0.10", 80, n.two, "pod-a", "pod-b"))
	check(t, k.reaches("udp", "10.96.0.10", 80, n.two, "pod-a", "pod-b"))
	// The client is outside the cluster CIDR: masqueraded.
	if r, err := k.dial("tcp", e2eClientIP, "10.96.0.10", 80, 2*time.Second); err != nil || r.Client != netip.MustParseAddr(e2eBridgeIP) {
		t.Errorf("web saw %v (%v), want the node's bridge address", r.Client, err)
	}
	check(t, k.reaches("tcp", e2eNodeIP, 30080, n.two, "pod-a", "pod-b"))
	check(t, k.reaches("tcp", "192.0.2.10", 80, n.two, "pod-a", "pod-b"))
	check(t, k.reaches("tcp", "203.0.113.5", 80, n.two, "pod-a", "pod-b"))
	check(t, k.unanswered("tcp", e2eOtherClient, "203.0.113.5", 80))
	if got, err := k.spread("tcp", "10.96.0.14", 80, n.three); err != nil || len(got) != 1 {
		t.Errorf("ClientIP affinity: %d connections reached %v (%v), want one backend", n.three, got, err)
	}
	// externalTrafficPolicy Local: this node's endpoint only, the
	// client's address kept.
	check(t, k.reaches("tcp", e2eNodeIP, 30085, n.one, "pod-a"))
	check(t, k.reaches("tcp", "203.0.113.15", 80, n.one, "pod-a"))
	if r, err := k.dial("tcp", e2eClientIP, e2eNodeIP, 30085, 2*time.Second); err != nil || r.Client != netip.MustParseAddr(e2eClientIP) {
		t.Errorf("local node port saw %v (%v), want the client's own address", r.Client, err)
	}
	check(t, k.reaches("tcp", "10.96.0.15", 80, n.two, "pod-a", "pod-b"))
	// internalTrafficPolicy Local.
	check(t, k.reaches("tcp", "10.96.0.16", 80, n.one, "pod-a"))
	check(t, k.refused("tcp", e2eClientIP, "10.96.0.17", 80))
	check(t, k.refused("udp", e2eClientIP, "10.96.0.17", 80))
	checkGet(t, k, "http://"+e2eNodeIP+":30185/", 200, `"localEndpoints":1`)
}

// churn edits the manifest of e2eScenario and checks that traffic
// follows: a Service scaled down (its stale UDP flow moving on) and up, one
// added and one deleted. With proxierClearsFlows the proxier's conntrack
// cleanup must be what moved the flow; in IPVS mode the kernel may get
// there first, since expire_nodest_conn ends an IPVS connection to a
// deleted real server, and its conntrack entry with it, on its next packet.
func (k *e2eNode) churn(t *testing.T, n e2eCounts, proxierClearsFlows bool) {
	deleted := `kubeproxy_conntrack_reconciler_deleted_entries_total{ip_family="IPv4"}`
	flowsDeleted := k.metric(deleted)
	// A UDP flow that pod-b answers: scaling pod-b out must clear its
	// conntrack entry, or the same socket keeps reaching pod-b, whose
	// backend still runs.
	udp := k.udpFlowTo(t, "10.96.0.10:80", "pod-b")
	k.cluster.service("web").pods = []string{"pod-a"}
	k.writeManifest()
	k.eventually(e2eChange, "scale down", func() error { return k.reaches("tcp", "10.96.0.10", 80, n.one, "pod-a") })
	// The cleanup follows the restore, so it may lag the TCP check.
	k.eventually(e2eChange, "stale UDP flow cleared", func() error {
		if got := udpAsk(udp); got != "pod-a" {
			return fmt.Errorf("the UDP flow's next datagram reached %q, want pod-a", got)
		}
		if got := k.metric(deleted); proxierClearsFlows && got <= flowsDeleted {
			return fmt.Errorf("conntrack entries deleted: %v, want more than %v", got, flowsDeleted)
		}
		return nil
	})
	k.cluster.service("web").pods = []string{"pod-a", "pod-b", "pod-c"}
	k.writeManifest()
	k.eventually(e2eChange, "scale up", func() error { return k.reaches("tcp", "10.96.0.10", 80, n.three, "pod-a", "pod-b", "pod-c") })

	k.cluster.services = append(k.cluster.services, e2eService{name: "added", ports: e2eTCP, pods: []string{"pod-c"}, spec: e2eClusterIP("10.96.0.20")})
	k.writeManifest()
	k.eventually(e2eChange, "service added", func() error { return k.reaches("tcp", "10.96.0.20", 80, n.one, "pod-c") })
	k.cluster.delete("np")
	k.writeManifest()
	// Nothing serves the node's port 30080 any more, and the cluster IP
	// leads nowhere. (The slice and the Service go in two events: in
	// between, the Service has no endpoints and is refused.)
	k.eventually(e2eChange, "service deleted", func() error {
		if err := k.refused("tcp", e2eClientIP, e2eNodeIP, 30080); err != nil {
			return err
		}
		return k.unanswered("tcp", e2eClientIP, "10.96.0.11", 80)
	})
}

// TestE2EOnceAndCleanup applies one sync with --once, checks that it
// serves, and removes it with --cleanup, which must leave the node's
// tables (iptables' and, in nftables mode, nft's whole ruleset) exactly as
// they were before, other programs' rules included.
func TestE2EOnceAndCleanup(t *testing.T) {
	forEachE2EMode(t, false, func(t *testing.T, m e2eMode) { testE2EOnceAndCleanup(t, m, nil) })
}

// testE2EOnceAndCleanup is TestE2EOnceAndCleanup in mode m; more, when
// set, checks more after --once (cleaned false) and after --cleanup.
func testE2EOnceAndCleanup(t *testing.T, m e2eMode, more func(t *testing.T, k *e2eNode, cleaned bool)) {
	k := newE2EModeNode(t, m, e2eScenario(), false)
	k.iptables(t, v1.IPv4Protocol, "-t", "filter", "-N", "KUBE-FIREWALL")
	k.iptables(t, v1.IPv4Protocol, "-t", "filter", "-A", "KUBE-FIREWALL", "-d", "127.0.0.0/8", "!", "-s", "127.0.0.0/8", "-j", "DROP")
	k.iptables(t, v1.IPv4Protocol, "-t", "filter", "-A", "INPUT", "-j", "KUBE-FIREWALL")
	k.iptables(t, v1.IPv4Protocol, "-t", "nat", "-A", "POSTROUTING", "-s", e2eClusterCIDR, "!", "-d", e2eClusterCIDR, "-j", "MASQUERADE")
	saveAll := func() string {
		var all string
		for _, table := range []string{"filter", "nat", "mangle"} {
			all += k.iptables(t, v1.IPv4Protocol, "-t", table, "-S")
		}
		if m.nftables() {
			// Stateless: the counters of the other programs' rules move.
			all += k.nft(t, "--stateless", "list", "ruleset")
		}
		return all
	}
	before := saveAll()

	// Localhost node ports rewrite the kubelet's KUBE-FIREWALL, as
	// kube-proxy does, and cleanup leaves that shared chain to the
	// kubelet; without them, the kubelet's rules stay untouched.
	if err := k.runProxier(append(k.extraArgs, "--once", "--mode", m.mode, "--manifests", k.dir, "--hostname-override", "node-a", "--cluster-cidr", e2eClusterCIDR,
		"--iptables-localhost-nodeports=false")...); err != nil {
		t.Fatalf("--once: %v\n%s", err, k.log.String())
	}
	// As many tries as randomCounts says, so that a random pick
	// missing one of two backends is not a failure (10 tries miss
	// one in 512 runs).
	check(t, k.reaches("tcp", "10.96.0.10", 80, randomCounts.two, "pod-a", "pod-b"))
	check(t, k.reaches("tcp", e2eNodeIP, 30080, randomCounts.two, "pod-a", "pod-b"))
	check(t, k.refused("tcp", e2eClientIP, "10.96.0.17", 80))
	if more != nil {
		more(t, k, false)
	}

	// With ebpf mode's pin path and prefix: the defaults are the
	// host's.
	if err := k.runProxier(append([]string{"--cleanup"}, k.extraArgs...)...); err != nil {
		t.Fatalf("--cleanup: %v\n%s", err, k.log.String())
	}
	after := saveAll()
	if before != after {
		t.Errorf("after --once and --cleanup the tables differ:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	check(t, k.unanswered("tcp", e2eClientIP, "10.96.0.10", 80))
	if more != nil {
		more(t, k, true)
	}
}

// e2eDualStackCluster is a node with an address of each family, and a
// dual-stack NodePort Service served by pod-a and pod-b in both, with
// more services.
func e2eDualStackCluster(more ...e2eService) *e2eCluster {
	return &e2eCluster{
		node: "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\nstatus: {addresses: [{type: InternalIP, address: " + e2eNodeIP + "}, {type: InternalIP, address: \"fd00:1::1\"}]}\n",
		services: append([]e2eService{
			{name: "dual", ports: e2eTCP, pods: []string{"pod-a", "pod-b"}, pods6: []string{"pod-a", "pod-b"},
				spec: "  type: NodePort\n  clusterIP: 10.96.0.10\n  clusterIPs: [10.96.0.10, \"fd00:96::10\"]\n  ipFamilies: [IPv4, IPv6]\n  ipFamilyPolicy: RequireDualStack\n" +
					"  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080, protocol: TCP}]\n"},
		}, more...),
	}
}

// TestE2EDualStack runs the proxier on a node with both families: a
// dual-stack Service is reachable on both cluster IPs, and an IPv6-only
// one on its own.
func TestE2EDualStack(t *testing.T) {
	forEachE2EMode(t, true, func(t *testing.T, m e2eMode) {
		c := e2eDualStackCluster(e2eService{name: "only6", ports: e2eTCP, pods6: []string{"pod-c"},
			spec: "  clusterIP: \"fd00:96::11\"\n  clusterIPs: [\"fd00:96::11\"]\n  ipFamilies: [IPv6]\n  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]\n"})
		k := newE2EModeNode(t, m, c, true)
		k.start(k.proxierArgs("--cluster-cidr", e2eClusterCIDR+",fd00:244::/64")...)

		check(t, k.reaches("tcp", "10.96.0.10", 80, 20, "pod-a", "pod-b"))
		for _, dst := range []string{"[fd00:96::10]:80", "[fd00:1::1]:30080", "[fd00:96::11]:80"} {
			got := map[string]int{}
			for range 20 {
				r, err := kerneltest.Dial(k.client, "tcp", netip.MustParseAddrPort(dst), 2*time.Second)
				if err != nil {
					t.Fatalf("tcp to %s: %v", dst, err)
				}
				got[r.Name]++
			}
			want := []string{"pod-a", "pod-b"}
			if dst == "[fd00:96::11]:80" {
				want = []string{"pod-c"}
			}
			for name := range got {
				if !slices.Contains(want, name) {
					t.Errorf("tcp to %s reached %s, want only %v", dst, name, want)
				}
			}
			if len(got) != len(want) {
				t.Errorf("tcp to %s reached %v, want each of %v", dst, got, want)
			}
		}
		if n := k.metric(`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv6"}`); n < 1 {
			t.Errorf("no IPv6 full sync in the metrics")
		}
	})
}
