package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/proxykit/proxykit/explain"
	"github.com/proxykit/proxykit/internal/testkit/apiservertest"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/iptables"
)

// The drop-in tests run the real kube-proxy, built from the release of our
// k8s.io dependencies beside kube-apiserver, and this proxier side by side:
// each in a node world of its own (the end-to-end tests' client, node and
// pods, with the same addresses in both), both watching one API server as
// the same node, node-a, started by the same command line. Whatever the
// test then sees differ between the two worlds is a difference between
// the proxiers.
//
//	world "kube-proxy": client ── node (kube-proxy) ── pods ┐
//	                                                        ├── control plane 10.2.0.2:6443
//	world "proxykit":   client ── node (proxier)    ── pods ┘
//
// Each node reaches the API server over a link of its own (10.2.N.1 to
// 10.2.N.2, routed to the server's address on the control plane's
// loopback). kube-proxy runs with --conntrack-max-per-core 0, which leaves
// nf_conntrack_max and the conntrack hash size alone: both are host-wide
// (the first is read-only outside the host's namespace, the second is a
// module parameter). The other conntrack sysctls it sets, and the
// route_localnet it sets for localhost node ports, are its node
// namespace's own.

// dropInServer is the API server's address, on the control plane's
// loopback.
var dropInServer = netip.MustParseAddr("10.2.0.2")

// dropInNewNodeIP is the node's address after TestAPIServerDropIn changes
// it, added beside the first.
const dropInNewNodeIP = "10.1.0.9"

// dropInProc is one proxier, kube-proxy or ours, running in its world's
// node.
type dropInProc struct {
	name   string
	cmd    *exec.Cmd
	log    *logBuffer
	exited chan struct{}
	err    error
	// started is when it was started.
	started time.Time
}

// running reports whether the process has not exited.
func (p *dropInProc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// dropInWorld is a node world and its proxier.
type dropInWorld struct {
	*e2eNode
	name string
	proc *dropInProc
}

// dropInCluster is the control plane the worlds share.
type dropInCluster struct {
	bin  string
	cp   *kerneltest.NS
	c    *apiservertest.Cluster
	kube kubernetes.Interface
	// links counts the node links made, for their addresses.
	links int
}

// newDropInWorld builds a node world, with IPv6 addresses on every link
// (the Node object lists only the IPv4 one), linked to the control plane.
func (dc *dropInCluster) newDropInWorld(t testing.TB, name string) *dropInWorld {
	t.Helper()
	w := &dropInWorld{e2eNode: newE2ENode(t, iptables.BackendNFT, &e2eCluster{}, true), name: name}
	// A connection tried before the proxier's rules leaves a conntrack
	// entry without NAT, which a later connection from the same client
	// port (reused at once after a failed connect) would follow for the
	// 120s of the syn_sent timeout instead of the rules; one second keeps
	// the polls of both worlds to what the rules say.
	w.node.Sysctl(t, "net.netfilter.nf_conntrack_tcp_timeout_syn_sent", "1")
	dc.links++
	nodeAddr := netip.AddrFrom4([4]byte{10, 2, byte(dc.links), 1})
	cpAddr := netip.AddrFrom4([4]byte{10, 2, byte(dc.links), 2})
	kerneltest.Link(t, w.node, dc.cp, netip.PrefixFrom(nodeAddr, 24), netip.PrefixFrom(cpAddr, 24))
	w.node.AddRoute(t, netip.PrefixFrom(dropInServer, 32), cpAddr)
	return w
}

// start runs path with args in the world's node, with the node's xtables
// lock, and stops it when the test ends.
func (w *dropInWorld) start(t testing.TB, path string, args ...string) {
	t.Helper()
	p := &dropInProc{name: w.name, log: &logBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(path, args...)
	p.cmd.Env = append(os.Environ(), "XTABLES_LOCKFILE="+w.lockFile)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	// Its own process group: a ^C of the test leaves it to the cleanup.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.started = time.Now()
	if err := w.node.Do(p.cmd.Start); err != nil {
		t.Fatalf("starting %s: %v", w.name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	w.proc = p
	t.Cleanup(func() {
		if p.running() {
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() || os.Getenv("E2E_LOG") != "" {
			t.Logf("%s log:\n%s", w.name, p.log.String())
		}
	})
}

// ready waits until the world's proxier answers /healthz with 200 and
// forwards the kubernetes Service's neighbour web, failing t if it exits
// first.
func (w *dropInWorld) ready(t testing.TB) {
	t.Helper()
	defer func() {
		t.Logf("%s serving %v after its start", w.name, time.Since(w.proc.started).Round(10*time.Millisecond))
	}()
	eventually(t, 2*apiChange, w.name+" serving", func() error {
		if !w.proc.running() {
			t.Fatalf("%s exited: %v\n%s", w.name, w.proc.err, w.proc.log.String())
		}
		code, body, err := w.get("http://" + e2eNodeIP + ":10256/healthz")
		if err != nil || code != 200 {
			return fmt.Errorf("/healthz: %d %s %v", code, body, err)
		}
		return w.reaches("tcp", "10.96.0.10", 80, 10, "pod-a", "pod-b")
	})
}

// probe makes n connections from src (in the client, or the node when
// fromNode) to to:port and describes what happened, the same way for the
// same outcome: the backends reached and the client address each saw, or
// how the first failed connection failed.
func (w *dropInWorld) probe(fromNode bool, network, src, to string, port, n int) string {
	ns := w.client
	var srcAddr netip.Addr
	if fromNode {
		ns = w.node
	} else {
		srcAddr = netip.MustParseAddr(src)
	}
	got := map[string]bool{}
	for range n {
		r, err := kerneltest.DialFrom(ns, network, srcAddr, netip.AddrPortFrom(netip.MustParseAddr(to), uint16(port)), 500*time.Millisecond)
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			return "refused"
		case kerneltest.IsTimeout(err):
			return "no answer"
		case err != nil:
			return "error"
		}
		got[r.Name+" saw "+r.Client.String()] = true
	}
	return strings.Join(slices.Sorted(maps.Keys(got)), ", ")
}

// dropInProbe is one kind of traffic both worlds are tried with.
type dropInProbe struct {
	name     string
	fromNode bool
	src, to  string
	port     int
	// want is the outcome, when the test knows it beforehand (both
	// proxiers broken the same way must not pass); empty means only that
	// both agree.
	want string
}

// dropInServices writes the Services and slices the probes try, as the
// API server allocates and validates them, with the load balancers'
// addresses in their status.
func (dc *dropInCluster) dropInServices(t *testing.T) {
	t.Helper()
	k := &apiNode{kube: dc.kube, ctx: t.Context()}
	k.createService(t, apiService("web", "10.96.0.10"))
	k.putSlice(t, apiSlice("web", "pod-a", "pod-b"))
	k.createService(t, apiService("np", "10.96.0.11", func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = 30080
	}))
	k.putSlice(t, apiSlice("np", "pod-a", "pod-b"))
	lb := func(nodePort int32, edit func(*v1.Service)) func(*v1.Service) {
		return func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = nodePort
			edit(s)
		}
	}
	k.createService(t, apiService("lb", "10.96.0.13", lb(30083, func(s *v1.Service) {
		s.Spec.LoadBalancerSourceRanges = []string{e2eClientIP + "/32"}
	})))
	k.putSlice(t, apiSlice("lb", "pod-a", "pod-b"))
	k.createService(t, apiService("local", "10.96.0.15", lb(30085, func(s *v1.Service) {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = 30185
	})))
	k.putSlice(t, apiSlice("local", "pod-a", "pod-b"))
	for name, ip := range map[string]string{"lb": "203.0.113.5", "local": "203.0.113.15"} {
		svc, err := dc.kube.CoreV1().Services(e2eNS).Get(k.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		svc.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: ip}}
		if _, err := dc.kube.CoreV1().Services(e2eNS).UpdateStatus(k.ctx, svc, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("load balancer status of %s: %v", name, err)
		}
	}
	local := v1.ServiceInternalTrafficPolicyLocal
	k.createService(t, apiService("itp", "10.96.0.16", func(s *v1.Service) { s.Spec.InternalTrafficPolicy = &local }))
	k.putSlice(t, apiSlice("itp", "pod-a", "pod-b"))
	k.createService(t, apiService("empty", "10.96.0.17"))
	policy := v1.IPFamilyPolicyRequireDualStack
	k.createService(t, apiService("dual", "", func(s *v1.Service) {
		s.Spec.IPFamilyPolicy = &policy
		s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
		s.Spec.ClusterIPs = []string{"10.96.0.20", "fd00:96::20"}
		s.Spec.ClusterIP = "10.96.0.20"
	}))
	k.putSlice(t, apiSlice("dual", "pod-a", "pod-b"))
	k.putSlice(t, apiSlice6("dual", "pod-a", "pod-b"))
}

// dropInProbes are the kinds of traffic compared, as seen from the node's
// client (10.1.0.2, and 10.1.0.3 outside the load balancer's source
// range) and from the node itself. The pods are pod-a (on node-a, this
// node) and pod-b (on node-b); the bridge address 10.244.0.1 is what a
// pod sees of a masqueraded client.
var dropInProbes = []dropInProbe{
	{name: "ClusterIP", src: e2eClientIP, to: "10.96.0.10", port: 80},
	{name: "ClusterIP from the node", fromNode: true, to: "10.96.0.10", port: 80},
	{name: "NodePort", src: e2eClientIP, to: e2eNodeIP, port: 30080,
		want: "pod-a saw 10.244.0.1, pod-b saw 10.244.0.1"},
	{name: "NodePort's cluster IP", src: e2eClientIP, to: "10.96.0.11", port: 80},
	{name: "NodePort on localhost, from the node", fromNode: true, to: "127.0.0.1", port: 30080},
	{name: "ETP Local NodePort", src: e2eClientIP, to: e2eNodeIP, port: 30085, want: "pod-a saw " + e2eClientIP},
	{name: "ETP Local load balancer IP", src: e2eClientIP, to: "203.0.113.15", port: 80, want: "pod-a saw " + e2eClientIP},
	{name: "ETP Local cluster IP", src: e2eClientIP, to: "10.96.0.15", port: 80},
	{name: "ITP Local cluster IP", src: e2eClientIP, to: "10.96.0.16", port: 80},
	{name: "ITP Local cluster IP from the node", fromNode: true, to: "10.96.0.16", port: 80},
	{name: "no endpoints", src: e2eClientIP, to: "10.96.0.17", port: 80, want: "refused"},
	{name: "source range, allowed", src: e2eClientIP, to: "203.0.113.5", port: 80},
	{name: "source range, other source", src: e2eOtherClient, to: "203.0.113.5", port: 80, want: "no answer"},
	{name: "source range's NodePort, other source", src: e2eOtherClient, to: e2eNodeIP, port: 30083},
	{name: "dual-stack Service's IPv4 cluster IP", src: e2eClientIP, to: "10.96.0.20", port: 80},
}

// dropInMode is how one subtest of TestAPIServerDropIn starts both
// proxiers: with flags alone (as k3s, kops and hand-made units do) or
// with a configuration file (as kubeadm does).
type dropInMode struct {
	mode     string
	useFile  bool
	nftables bool
}

// args returns the command line both proxiers get, with the iptables and
// nftables sync periods given.
func (m dropInMode) args(t testing.TB, kubeconfig, syncPeriod, minSyncPeriod string) []string {
	t.Helper()
	if !m.useFile {
		return []string{"--kubeconfig", kubeconfig, "--hostname-override", "node-a", "--proxy-mode", m.mode,
			"--cluster-cidr", e2eClusterCIDR + ",fd00:244::/64", "--iptables-sync-period", syncPeriod, "--iptables-min-sync-period", minSyncPeriod,
			"--conntrack-max-per-core", "0",
			"--healthz-bind-address", e2eNodeIP + ":10256", "--metrics-bind-address", e2eNodeIP + ":10249", "--v", "2"}
	}
	file := filepath.Join(t.TempDir(), "kube-proxy.yaml")
	config := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
mode: %s
clusterCIDR: %s,fd00:244::/64
healthzBindAddress: %s:10256
metricsBindAddress: %s:10249
iptables:
  syncPeriod: %[6]s
  minSyncPeriod: %[7]s
nftables:
  syncPeriod: %[6]s
  minSyncPeriod: %[7]s
conntrack:
  maxPerCore: 0
`, kubeconfig, m.mode, e2eClusterCIDR, e2eNodeIP, e2eNodeIP, syncPeriod, minSyncPeriod)
	if err := os.WriteFile(file, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{"--config", file, "--hostname-override", "node-a", "--v", "2"}
}

// dropInModes are the modes compared: iptables mode started with flags
// alone, nftables mode with a configuration file.
var dropInModes = []dropInMode{
	{mode: modeIPTables},
	{mode: modeNFTables, useFile: true, nftables: true},
}

// newDropInCluster starts the control plane, with a dual-stack service
// range, and writes the test's namespace. It skips (or fails, under
// PROXYKIT_REQUIRE_KERNEL=1) where the tier cannot run.
func newDropInCluster(t testing.TB) *dropInCluster {
	t.Helper()
	bin := apiservertest.Require(t, append(e2eTools(iptables.BackendNFT), "ip6tables-nft", "ip6tables-nft-save", "ip6tables-nft-restore", "nft")...)
	dc := &dropInCluster{bin: bin, cp: kerneltest.NewNS(t)}
	dc.cp.AddAddr(t, "lo", netip.PrefixFrom(dropInServer, 32))
	start := time.Now()
	dc.c = apiservertest.Start(t, dc.cp, bin, apiservertest.Config{
		APIServers:   []netip.Addr{dropInServer},
		ServiceCIDRs: []netip.Prefix{prefix("10.96.0.0/16"), prefix("fd00:96::/112")},
	})
	t.Logf("control plane ready in %v", time.Since(start).Round(time.Millisecond))
	dc.kube = dc.c.Client()
	if _, err := dc.kube.CoreV1().Namespaces().Create(context.Background(), &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e2eNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return dc
}

// TestAPIServerDropIn runs the real kube-proxy and this proxier side by
// side on one API server, per mode, from the same command line, and
// compares what they do: the packets of every kind of Service from the
// client and from the node, the metric families each serves, the IP
// families each programs, and what each does when the node's address
// changes.
func TestAPIServerDropIn(t *testing.T) {
	dc := newDropInCluster(t)
	kubeProxy := apiservertest.KubeProxy(dc.bin)
	dc.dropInServices(t)
	kubeconfig := dc.c.APIServer(0).Kubeconfig(t)

	for _, m := range dropInModes {
		t.Run(m.mode, func(t *testing.T) {
			dc.putNode(t, e2eNodeIP)
			kp, ours := dc.newDropInWorld(t, "kube-proxy"), dc.newDropInWorld(t, "proxykit")
			worlds := []*dropInWorld{kp, ours}
			args := m.args(t, kubeconfig, "10s", "100ms")
			t.Logf("both run with: %s", strings.Join(args, " "))
			host := hostConntrackSettings(t)
			ourBinary := proxierBinary(t) // built before either starts
			kp.start(t, kubeProxy, args...)
			ours.start(t, ourBinary, args...)
			for _, w := range worlds {
				w.ready(t)
			}
			// kube-proxy set its conntrack timeouts in its node's
			// namespace, and nothing of the host's.
			if got, err := kp.node.Exec("cat", "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait"); err != nil || strings.TrimSpace(got) != "3600" {
				t.Errorf("kube-proxy's node has nf_conntrack_tcp_timeout_close_wait %q (%v), want kube-proxy's 3600", got, err)
			}
			if diff := cmp.Diff(host, hostConntrackSettings(t)); diff != "" {
				t.Errorf("the host's conntrack settings changed (-before +after):\n%s", diff)
			}

			t.Run("packets", func(t *testing.T) {
				for _, p := range dropInProbes {
					var got [2]string
					for i, w := range worlds {
						got[i] = w.probe(p.fromNode, "tcp", p.src, p.to, p.port, 20)
					}
					t.Logf("%s: %s", p.name, got[0])
					if got[0] != got[1] {
						t.Errorf("%s (%s:%d): kube-proxy: %q, proxykit: %q", p.name, p.to, p.port, got[0], got[1])
					} else if p.want != "" && got[0] != p.want {
						t.Errorf("%s (%s:%d): both %q, want %q", p.name, p.to, p.port, got[0], p.want)
					}
				}
			})

			// explain reads both nodes' rules, the real kube-proxy's
			// included, and says the same of every probe: the packets
			// matched, so their outcomes must too, and they must agree
			// with what the probes saw.
			t.Run("explain", func(t *testing.T) {
				for _, p := range dropInProbes {
					from := p.src
					if p.fromNode {
						from = "node"
					}
					var got [2]string
					for i, w := range worlds {
						var stdout, stderr bytes.Buffer
						args := []string{"packet", fmt.Sprintf("%s:%d/tcp", p.to, p.port), "--from", from, "--mode", m.mode, "--netns", "/run/netns/" + w.node.Name, "-o", "json"}
						if status := explainMain(testLogger(&logBuffer{}, 0), args, realEnvironment(&stdout), &stderr); status != 0 {
							t.Errorf("%s on %s's node: status %d: %s", p.name, w.name, status, stderr.String())
							continue
						}
						var ex explain.Explanation
						if err := json.Unmarshal(stdout.Bytes(), &ex); err != nil {
							t.Fatalf("%s on %s's node: %v\n%s", p.name, w.name, err, stdout.String())
						}
						got[i] = explainedEnds(ex.Outcomes)
					}
					t.Logf("%s: %s", p.name, got[0])
					if got[0] != got[1] {
						t.Errorf("%s (%s:%d) explained: on kube-proxy's node %q, on proxykit's %q", p.name, p.to, p.port, got[0], got[1])
					}
					switch p.want {
					case "refused":
						if got[0] != "REJECT p=1" {
							t.Errorf("%s: refused, explained as %q", p.name, got[0])
						}
					case "no answer":
						if got[0] != "DROP p=1" {
							t.Errorf("%s: no answer, explained as %q", p.name, got[0])
						}
					}
				}
			})

			t.Run("health check node port", func(t *testing.T) {
				var got [2]string
				for i, w := range worlds {
					code, body, err := w.get("http://" + e2eNodeIP + ":30185/")
					var health struct {
						LocalEndpoints int `json:"localEndpoints"`
					}
					if err == nil {
						err = json.Unmarshal([]byte(body), &health)
					}
					got[i] = fmt.Sprintf("%d localEndpoints=%d %v", code, health.LocalEndpoints, err)
				}
				if got[0] != got[1] {
					t.Errorf("ETP Local health check: kube-proxy: %s, proxykit: %s", got[0], got[1])
				}
			})

			t.Run("metric families", func(t *testing.T) {
				compareMetricFamilies(t, kp.metricFamilies(t), ours.metricFamilies(t))
			})

			t.Run("IP families", func(t *testing.T) {
				// The Node lists an IPv4 address only; kube-proxy runs
				// its IPv6 proxier anyway, because the kernel supports
				// IPv6, and serves the dual-stack Service's IPv6 cluster
				// IP.
				var fams [2][]v1.IPFamily
				var packets [2]string
				for i, w := range worlds {
					fams[i] = w.programmedFamilies(t, m.nftables)
					packets[i] = w.probe(false, "tcp", apiClientIP6, "fd00:96::20", 80, 20)
				}
				want := []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
				if !slices.Equal(fams[0], want) || packets[0] != "pod-a saw fd00:244::1, pod-b saw fd00:244::1" {
					t.Fatalf("kube-proxy programs %v and serves the IPv6 cluster IP with %q: the test's premise (both families) is wrong", fams[0], packets[0])
				}
				if !slices.Equal(fams[0], fams[1]) || packets[0] != packets[1] {
					t.Errorf("IP families with service rules: kube-proxy %v, proxykit %v; the IPv6 cluster IP: kube-proxy %q, proxykit %q", fams[0], fams[1], packets[0], packets[1])
				}
			})

			t.Run("node IP change", func(t *testing.T) {
				for _, w := range worlds {
					// On the bridge: the client routes every address
					// through the node, which delivers its own.
					w.node.AddAddr(t, "br0", prefix(dropInNewNodeIP+"/32"))
				}
				dc.putNode(t, dropInNewNodeIP)
				// kube-proxy exits (status 1) so that its restart picks up
				// the new address.
				select {
				case <-kp.proc.exited:
					var ee *exec.ExitError
					if !errors.As(kp.proc.err, &ee) || ee.ExitCode() != 1 {
						t.Errorf("kube-proxy exited with %v, want exit status 1", kp.proc.err)
					}
				case <-time.After(apiChange):
					t.Fatalf("kube-proxy still runs %v after the node's address changed", apiChange)
				}
				// Ours either exits the same way, or follows the change
				// without a restart: node ports on the new address.
				err := ours.followsNodeIP(m)
				if err != nil && ours.proc.running() {
					t.Errorf("proxykit neither exited nor followed the node's new address: %v", err)
				}
				if !ours.proc.running() {
					var ee *exec.ExitError
					if !errors.As(ours.proc.err, &ee) || ee.ExitCode() != 1 {
						t.Errorf("proxykit exited with %v, want exit status 1 as kube-proxy's", ours.proc.err)
					}
				}
			})
		})
	}
}

// hostConntrackSettings reads, in the test's own (the host's) namespace,
// the conntrack settings kube-proxy may write.
func hostConntrackSettings(t testing.TB) map[string]string {
	t.Helper()
	settings := map[string]string{}
	for _, f := range []string{
		"/proc/sys/net/netfilter/nf_conntrack_max",
		"/sys/module/nf_conntrack/parameters/hashsize",
		"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established",
		"/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait",
		"/proc/sys/net/ipv4/conf/all/route_localnet",
	} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		settings[f] = strings.TrimSpace(string(data))
	}
	return settings
}

// putNode writes node-a with InternalIP ip (and its zone), creating it
// the first time.
func (dc *dropInCluster) putNode(t testing.TB, ip string) {
	t.Helper()
	nodes := dc.kube.CoreV1().Nodes()
	node, err := nodes.Get(context.Background(), "node-a", metav1.GetOptions{})
	if err != nil {
		node = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: "zone-a"}}}
		if node, err = nodes.Create(context.Background(), node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	node.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: ip}}
	if _, err := nodes.UpdateStatus(context.Background(), node, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("node-a's address %s: %v", ip, err)
	}
}

// followsNodeIP checks, within apiChange, that the proxier serves the
// NodePort on the node's new address, and in nftables mode, whose node
// ports are on the node's own IPs only, no longer on the old one.
func (w *dropInWorld) followsNodeIP(m dropInMode) error {
	deadline := time.Now().Add(apiChange)
	for {
		var err error
		if got := w.probe(false, "tcp", e2eClientIP, dropInNewNodeIP, 30080, 10); got != "pod-a saw 10.244.0.1, pod-b saw 10.244.0.1" {
			err = fmt.Errorf("NodePort on %s: %s", dropInNewNodeIP, got)
		} else if got := w.probe(false, "tcp", e2eClientIP, e2eNodeIP, 30080, 1); m.nftables && got != "refused" {
			err = fmt.Errorf("NodePort on the old address %s: %s", e2eNodeIP, got)
		}
		if err == nil || !w.proc.running() || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// metricFamilies returns the metric families of the proxier's /metrics,
// by name, with their types.
func (w *dropInWorld) metricFamilies(t *testing.T) map[string]string {
	t.Helper()
	code, body, err := w.get("http://" + e2eNodeIP + ":10249/metrics")
	if err != nil || code != 200 {
		t.Fatalf("%s /metrics: %d %v", w.name, code, err)
	}
	fams := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			fams[f[2]] = f[3]
		}
	}
	return fams
}

// The reasons of dropInMetricExceptions that several prefixes share.
const (
	goRuntimeMetrics = "Go runtime internals (runtime/metrics), exported whole by component-base's registry"
	apiserverMetrics = "registered by k8s.io/apiserver packages kube-proxy links; they count API server work it never does"
	registryMetrics  = "component-base's count of its own registrations; this proxier uses client_golang's registry"
)

// dropInMetricExceptions are the metric families kube-proxy serves and
// this proxier need not, by prefix of their names, each with the reason.
// Most come with the libraries kube-proxy is linked with, not from its
// proxy.
var dropInMetricExceptions = map[string]string{
	// The families both serve (go_goroutines, go_memstats_*, ...) are
	// compared; these are the rest of the Go runtime's runtime/metrics,
	// which component-base's registry exports whole.
	"go_cgo_":                 goRuntimeMetrics,
	"go_cpu_classes_":         goRuntimeMetrics,
	"go_gc_":                  goRuntimeMetrics,
	"go_godebug_":             goRuntimeMetrics,
	"go_memory_classes_":      goRuntimeMetrics,
	"go_sched_":               goRuntimeMetrics,
	"go_sync_":                goRuntimeMetrics,
	"apiserver_":              apiserverMetrics,
	"aggregator_discovery_":   apiserverMetrics,
	"registered_metrics_":     registryMetrics,
	"disabled_metrics_":       registryMetrics,
	"hidden_metrics_":         registryMetrics,
	"cardinality_enforcement": registryMetrics,
	"kubernetes_feature_":     "kube-proxy's feature gates; this proxier has none (--feature-gates is refused)",
	"kubernetes_build_info":   "the version of a Kubernetes release build, which this proxier is not (it has --version)",
	// kube-proxy registers these vectors at start but shows a family
	// only once its conntrack reconciler has observed a value; this
	// proxier shows them from its first sync.
	"kubeproxy_conntrack_reconciler_": "shown by kube-proxy only after its first conntrack reconciliation",
}

// hasPrefixIn reports whether name begins with one of prefixes.
func hasPrefixIn(name string, prefixes []string) bool {
	return slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(name, p) })
}

// compareMetricFamilies fails t for every metric family, with its type,
// that one of kube-proxy and proxykit serves and the other does not,
// except dropInMetricExceptions (on kube-proxy's side).
func compareMetricFamilies(t *testing.T, kp, ours map[string]string) {
	t.Helper()
	exceptions := slices.Collect(maps.Keys(dropInMetricExceptions))
	var onlyKP, onlyOurs, types []string
	for name, typ := range kp {
		switch o, ok := ours[name]; {
		case ok && o != typ:
			types = append(types, fmt.Sprintf("%s: kube-proxy's is a %s, proxykit's a %s", name, typ, o))
		case ok, hasPrefixIn(name, exceptions):
		default:
			onlyKP = append(onlyKP, name)
		}
	}
	for name := range ours {
		if _, ok := kp[name]; !ok && !hasPrefixIn(name, exceptions) {
			onlyOurs = append(onlyOurs, name)
		}
	}
	for _, d := range []struct {
		what  string
		names []string
	}{{"served by kube-proxy alone", onlyKP}, {"served by proxykit alone", onlyOurs}, {"of other types", types}} {
		if len(d.names) > 0 {
			slices.Sort(d.names)
			t.Errorf("%d metric families %s:\n%s", len(d.names), d.what, strings.Join(d.names, "\n"))
		}
	}
}

// programmedFamilies returns the IP families in which the world's node
// holds the proxier's service rules: the KUBE-SERVICES chain of the nat
// table in iptables mode, the kube-proxy table in nftables mode.
func (w *dropInWorld) programmedFamilies(t *testing.T, nftables bool) []v1.IPFamily {
	t.Helper()
	var fams []v1.IPFamily
	for _, f := range []struct {
		family       v1.IPFamily
		iptables     string
		nftablesName string
	}{{v1.IPv4Protocol, "iptables-nft", "ip"}, {v1.IPv6Protocol, "ip6tables-nft", "ip6"}} {
		var err error
		if nftables {
			_, err = w.node.Exec("nft", "list", "table", f.nftablesName, "kube-proxy")
		} else {
			err = w.node.Do(func() error {
				cmd := exec.Command(f.iptables, "-t", "nat", "-S", "KUBE-SERVICES")
				cmd.Env = append(os.Environ(), "XTABLES_LOCKFILE="+w.lockFile)
				return cmd.Run()
			})
		}
		if err == nil {
			fams = append(fams, f.family)
		}
	}
	return fams
}

// explainedEnds is how explain says a packet ends, without the path:
// each outcome's verdict, endpoint, masquerade and probability, in a
// stable order.
func explainedEnds(outcomes []explain.Outcome) string {
	var ends []string
	for _, o := range outcomes {
		e := string(o.Verdict)
		if o.Endpoint.IsValid() {
			e += " " + o.Endpoint.String()
		}
		if o.Masquerade {
			e += " masquerade"
		}
		ends = append(ends, fmt.Sprintf("%s p=%.3g", e, o.Probability))
	}
	slices.Sort(ends)
	return strings.Join(ends, ", ")
}
