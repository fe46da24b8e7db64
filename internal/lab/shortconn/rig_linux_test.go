package shortconn_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/internal/testkit/ruleload"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/proxy"
)

// The network of every rig. The client stands for a pod of the node on a
// routed link (the cluster CIDR holds it, so no mode masquerades it, as
// the socket load balancer never does); the server pod has the two
// endpoint addresses of the measured Service. The other Services'
// endpoints (writertest.LoadBench's 10.128.0.0/10) are addresses no
// namespace has; no connection goes to them.
const (
	clientAddr  = "10.1.0.2/24"
	nodeAddr    = "10.1.0.1/24"
	bridgeAddr  = "10.0.0.1/16"
	clusterCIDR = "10.0.0.0/14"
	servicePort = 80   // writertest.Service's
	backendPort = 8080 // writertest.TCP8080
	// harnessPort is where kerneltest's own backend listens in the pod;
	// nothing connects to it (it answers without reading a request).
	harnessPort = 8081
	// perService is the number of endpoints of every Service.
	perService = 2
)

// podEndpoints are the server pod's addresses, the measured Service's
// endpoints.
var podEndpoints = []netip.Addr{netip.MustParseAddr("10.0.1.1"), netip.MustParseAddr("10.0.1.2")}

// mode is what proxies the Services.
type mode string

const (
	// modeIPTables is iptables mode's writer, applied with
	// iptables-legacy-restore.
	modeIPTables mode = "iptables"
	// modeIPTablesNFT is the same writer applied with
	// iptables-nft-restore (diagnostic).
	modeIPTablesNFT mode = "iptables-nft"
	// modeNFTables is nftables mode's writer.
	modeNFTables mode = "nftables"
	// modeEBPF is the socket load balancer on the client's cgroup and
	// nftables mode's rules on the node, as --mode ebpf runs them.
	modeEBPF mode = "ebpf"
	// modeEBPFAlone is the socket load balancer with no rules on the
	// node (diagnostic: what nftables beside it costs the connections
	// it translated).
	modeEBPFAlone mode = "ebpf-alone"
)

var (
	defaultModes = []mode{modeIPTables, modeNFTables, modeEBPF}
	allModes     = []mode{modeIPTables, modeIPTablesNFT, modeNFTables, modeEBPF, modeEBPFAlone}
)

func (m mode) iptablesBackend() (iptables.Backend, bool) {
	switch m {
	case modeIPTables:
		return iptables.BackendLegacy, true
	case modeIPTablesNFT:
		return iptables.BackendNFT, true
	}
	return "", false
}

func (m mode) nftables() bool { return m == modeNFTables || m == modeEBPF }

func (m mode) ebpf() bool { return m == modeEBPF || m == modeEBPFAlone }

// tools returns the binaries the mode needs.
func (m mode) tools() []string {
	if b, ok := m.iptablesBackend(); ok {
		return []string{"iptables-" + string(b), "iptables-" + string(b) + "-save", "iptables-" + string(b) + "-restore"}
	}
	if m.nftables() {
		return []string{"nft"}
	}
	return nil
}

// modesFromEnv returns the modes PROXYKIT_SHORTCONN_MODES names, or
// defaultModes.
func modesFromEnv(t testing.TB) []mode {
	s := os.Getenv("PROXYKIT_SHORTCONN_MODES")
	if s == "" {
		return defaultModes
	}
	var out []mode
	for _, name := range strings.Split(s, ",") {
		if !slices.Contains(allModes, mode(name)) {
			t.Fatalf("PROXYKIT_SHORTCONN_MODES: unknown mode %q, want some of %v", name, allModes)
		}
		out = append(out, mode(name))
	}
	return out
}

// cluster is the input every mode renders: writertest.LoadBench's n
// Services of perService endpoints, the one that sorts last served by the
// pod.
type cluster struct {
	n    int
	in   *proxy.FamilyInput
	last netip.AddrPort // the measured Service's cluster IP and port
}

func newCluster(t testing.TB, n int) *cluster {
	t.Helper()
	c := writertest.NewCluster(v1.IPv4Protocol, writertest.Node)
	c.NodeIPs = []netip.Addr{prefix(nodeAddr).Addr()}
	c.LoadBench(n, perService)
	// The iptables writer orders KUBE-SERVICES by namespace and name
	// (TestShortConnReach checks that it still does), so bench/svc-999
	// sorts after bench/svc-1000.
	names := make([]string, 0, len(c.Services))
	for key := range c.Services {
		names = append(names, key)
	}
	slices.Sort(names)
	svc := c.Services[names[len(names)-1]]
	var eps []writertest.Endpoint
	for _, a := range podEndpoints {
		eps = append(eps, writertest.Endpoint{IP: a.String(), Node: "node-b"})
	}
	c.SetEndpoints(svc.Namespace, svc.Name, writertest.TCP8080, eps...)
	return &cluster{
		n:    n,
		in:   c.Input(),
		last: netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), servicePort),
	}
}

func prefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// nodeConfig is the node every writer is given.
func nodeConfig() proxy.NodeConfig {
	return proxy.NodeConfig{Name: writertest.Node, ClusterCIDRs: []netip.Prefix{prefix(clusterCIDR)}}
}

// rig is one mode's network with c's Services programmed.
type rig struct {
	mode mode
	nw   *kerneltest.ProxyNetwork
	// cgroup is the client's cgroup; the ebpf modes' programs are
	// attached to it.
	cgroup string
	ipt    iptables.Interface // the iptables modes only
	// load is how long programming the Services took, from the first
	// sync's rendering to the kernel's answer.
	load time.Duration
}

// newRig builds a network for m and programs c in it. Everything is
// removed when t ends. Call kerneltest.Require(t, m.tools()...) first.
func newRig(t testing.TB, m mode, c *cluster) *rig {
	t.Helper()
	p := prefix
	r := &rig{mode: m, nw: kerneltest.NewProxyNetwork(t, kerneltest.ProxyNetworkConfig{
		ClientAddrs: []netip.Prefix{p(clientAddr)},
		NodeAddrs:   []netip.Prefix{p(nodeAddr)},
		BridgeAddrs: []netip.Prefix{p(bridgeAddr)},
		Pods:        []kerneltest.NetworkPod{{Name: "server", Addrs: []netip.Prefix{netip.PrefixFrom(podEndpoints[0], 16), netip.PrefixFrom(podEndpoints[1], 16)}}},
		BackendPort: harnessPort,
	})}
	startServer(t, r.nw.Pods["server"], backendPort)
	// Every port for the client's connections to one address.
	r.nw.Client.Sysctl(t, "net.ipv4.ip_local_port_range", "1024 65535")

	// A cgroup of the test's own for every mode's client, so that every
	// client runs under the same (inherited) cgroup programs but for the
	// socket load balancer's.
	cgRoot, bpffs := kerneltest.MountCgroupAndBPF(t)
	r.cgroup = filepath.Join(cgRoot, fmt.Sprintf("proxykit-shortconn-%d-%s-%d", os.Getpid(), m, c.n))
	if err := os.Mkdir(r.cgroup, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.Remove(r.cgroup); err != nil {
			t.Errorf("removing the client's cgroup: %v", err)
		}
	})

	start := time.Now()
	var err error
	if b, ok := m.iptablesBackend(); ok {
		r.ipt, _, err = ruleload.IPTables(r.nw.Node, b, filepath.Join(t.TempDir(), "xtables.lock"), nodeConfig(), c.in)
	}
	if err == nil && m.nftables() {
		_, err = ruleload.NFTables(r.nw.Node, nodeConfig(), c.in)
	}
	if err == nil && m.ebpf() {
		err = r.loadEBPF(t, bpffs, c)
	}
	if err != nil {
		t.Fatalf("%s: programming %d Services: %v", m, c.n, err)
	}
	r.load = time.Since(start)
	return r
}

// loadEBPF attaches the socket load balancer to the client's cgroup, its
// maps pinned on the test's own bpffs, and writes c into them.
func (r *rig) loadEBPF(t testing.TB, bpffs string, c *cluster) error {
	cfg := ebpf.DatapathConfig{Family: v1.IPv4Protocol, CgroupPath: r.cgroup, PinPath: bpffs, NamePrefix: "shortconn"}
	dp, err := ebpf.Open(cfg)
	if err != nil {
		return err
	}
	t.Cleanup(func() {
		dp.Close()
		if err := ebpf.Cleanup(cfg); err != nil {
			t.Errorf("ebpf cleanup: %v", err)
		}
	})
	w, err := ebpf.NewWriter(dp, ebpf.WriterConfig{Family: v1.IPv4Protocol, Node: nodeConfig()})
	if err != nil {
		return err
	}
	_, err = w.Sync(context.Background(), c.in)
	return err
}

// client starts a client process in the rig's client namespace and
// cgroup, to c's measured Service, warmed up by warm connections.
func (r *rig) client(t testing.TB, c *cluster, warm int) *clientProc {
	t.Helper()
	return startClient(t, r.nw.Client, r.cgroup, c.last, warm)
}
