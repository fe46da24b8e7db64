package ipvsmode_test

// IPVS mode on a real kernel, in the VM tier (see vm_linux_test.go): the
// translation applied by the Applier with the real reconcilers, ipsets over
// netlink and iptables-legacy-restore, in a director namespace that stands
// for the node, with real packets from a client namespace to backend
// namespaces.

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/ipvsvm"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/proxy"
)

// modeNode is a topology whose director runs IPVS mode.
type modeNode struct {
	*ipvsvm.Topology
	ipt     iptables.Interface
	sets    *ipset.Netlink
	applier *ipvsmode.Applier
}

func newModeNode(t *testing.T) *modeNode {
	t.Helper()
	tp := ipvsvm.NewTopology(t, 2)
	kerneltest.Require(t, "iptables-legacy", "iptables-legacy-save", "iptables-legacy-restore")
	ctx := context.Background()
	d := tp.Director
	// IPVS keeps conntrack entries for its connections, which the
	// masquerading rules need; rejections must reach the client at once.
	d.Sysctl(t, "net.ipv4.vs.conntrack", "1")
	d.Sysctl(t, "net.ipv4.conf.all.send_redirects", "0")
	d.Sysctl(t, "net.ipv4.conf.default.send_redirects", "0")
	d.Sysctl(t, "net.ipv4.icmp_ratelimit", "0")
	// A second client address, outside the load balancer's source range.
	tp.Client.AddAddr(t, tp.ClientLink, netip.MustParsePrefix("10.1.0.3/24"))

	m := &modeNode{Topology: tp}
	lock := filepath.Join(t.TempDir(), "xtables.lock")
	err := d.Do(func() (err error) {
		m.ipt, err = iptables.New(ctx, v1.IPv4Protocol, iptables.WithBackend(iptables.BackendLegacy), iptables.WithLockFile(lock))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if m.sets, err = ipset.New(ipset.WithNetNSPath("/run/netns/" + d.Name)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.sets.Close)
	m.applier = ipvsmode.NewApplier(ipvs.NewReconciler(tp.IFace, tp.Binder), ipset.NewReconciler(m.sets, ipvsmode.SetPrefix), m.ipt)
	return m
}

// apply applies tr in the director, where iptables must run.
func (m *modeNode) apply(t *testing.T, tr ipvsmode.SyncResult) ipvsmode.ApplyResult {
	t.Helper()
	var res ipvsmode.ApplyResult
	err := m.Director.Do(func() (err error) {
		res, err = m.applier.Apply(context.Background(), tr)
		return err
	})
	if err != nil {
		t.Fatalf("Apply: %v\n%s", err, tr.Payload)
	}
	return res
}

// dial dials dst from src (zero: the client's own address) n times and
// counts the replies per backend, and the sources the backends saw.
func (m *modeNode) dial(t *testing.T, src netip.Addr, dst string, n int) (backends map[string]int, sources map[string]bool) {
	t.Helper()
	backends, sources = map[string]int{}, map[string]bool{}
	for range n {
		r, err := kerneltest.DialFrom(m.Client, "tcp", src, netip.MustParseAddrPort(dst), 5*time.Second)
		if err != nil {
			t.Fatalf("tcp to %s: %v", dst, err)
		}
		backends[r.Name]++
		sources[r.Name+" saw "+r.Client.String()] = true
	}
	return backends, sources
}

// expect dials dst n times from the client's own address and compares the
// replies per backend, and the sources the backends saw, with the wanted
// ones.
func (m *modeNode) expect(t *testing.T, dst string, n int, backends map[string]int, sources map[string]bool) {
	t.Helper()
	got, seen := m.dial(t, netip.Addr{}, dst, n)
	if diff := cmp.Diff(backends, got); diff != "" {
		t.Errorf("replies per backend from %s (-want +got):\n%s", dst, diff)
	}
	if diff := cmp.Diff(sources, seen); diff != "" {
		t.Errorf("sources the backends of %s saw (-want +got):\n%s", dst, diff)
	}
}

// refused dials dst and checks that the connection is refused well within
// a second.
func (m *modeNode) refused(t *testing.T, dst string) {
	t.Helper()
	start := time.Now()
	_, err := kerneltest.Dial(m.Client, "tcp", netip.MustParseAddrPort(dst), 5*time.Second)
	if took := time.Since(start); !errors.Is(err, syscall.ECONNREFUSED) || took > time.Second {
		t.Errorf("tcp to %s: %v after %v, want a refusal at once", dst, err, took.Round(time.Millisecond))
	}
}

func TestVMMode(t *testing.T) {
	m := newModeNode(t)
	ctx := context.Background()
	kerneltest.StartBackend(t, m.Backends[0], "b1", 8080)
	kerneltest.StartBackend(t, m.Backends[1], "b2", 8080)

	nodeIPs, err := m.Binder.HostAddresses(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	cfg := ipvsmode.WriterConfig{
		Family:      v1.IPv4Protocol,
		Node:        proxy.NodeConfig{Name: nodeName, NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24")}, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16")}},
		RandomFully: m.ipt.HasRandomFully(),
	}
	b1 := endpoint{ip: m.BackendIPs[0].String(), local: true}
	b2 := endpoint{ip: m.BackendIPs[1].String()}
	tr := translateWith(t, cfg, nodeIPs,
		svcPort{name: "default/web", clusterIP: "10.96.0.10", port: 80, nodePort: 30080, endpoints: []endpoint{b1, b2}},
		svcPort{name: "default/lb", clusterIP: "10.96.0.11", port: 80, lbVIPs: []string{"198.51.100.10"}, sourceRanges: []string{"10.1.0.2/32"}, endpoints: []endpoint{b1, b2}},
		svcPort{name: "default/empty", clusterIP: "10.96.0.12", port: 80, nodePort: 30082},
		svcPort{name: "default/local", clusterIP: "10.96.0.13", port: 80, lbVIPs: []string{"198.51.100.13"}, etpLocal: true, hcNodePort: 32013, endpoints: []endpoint{b1, b2}},
	)
	if res := m.apply(t, tr); res.IPVS.VirtualServersAdded != len(tr.Services) {
		t.Fatalf("first apply: %+v, want %d virtual servers added", res, len(tr.Services))
	}
	// What the node's backends see when the director masquerades.
	masqueraded := map[string]bool{"b1 saw 10.2.0.1": true, "b2 saw 10.2.1.1": true}

	t.Run("ClusterIP: round robin, masqueraded from outside the cluster", func(t *testing.T) {
		m.expect(t, "10.96.0.10:80", 10, map[string]int{"b1": 5, "b2": 5}, masqueraded)
	})

	t.Run("NodePort on the node address", func(t *testing.T) {
		m.expect(t, "10.1.0.1:30080", 4, map[string]int{"b1": 2, "b2": 2}, masqueraded)
		// 10.2.0.1 is the node's too, but outside the node-port
		// addresses: nothing listens there.
		m.refused(t, "10.2.0.1:30080")
	})

	t.Run("a port no service has on a service address is refused", func(t *testing.T) {
		m.refused(t, "10.96.0.10:81")
	})

	t.Run("load balancer with a source range", func(t *testing.T) {
		if got, _ := m.dial(t, m.ClientIP, "198.51.100.10:80", 2); got["b1"]+got["b2"] != 2 {
			t.Errorf("from the source range: %v", got)
		}
		_, err := kerneltest.DialFrom(m.Client, "tcp", netip.MustParseAddr("10.1.0.3"), netip.MustParseAddrPort("198.51.100.10:80"), time.Second)
		if !kerneltest.IsTimeout(err) {
			t.Errorf("from outside the source range: %v, want no answer", err)
		}
	})

	t.Run("no endpoints: refused at once", func(t *testing.T) {
		m.refused(t, "10.96.0.12:80")
		m.refused(t, "10.1.0.1:30082")
	})

	t.Run("externalTrafficPolicy Local: the local endpoint only, source kept", func(t *testing.T) {
		m.expect(t, "198.51.100.13:80", 6, map[string]int{"b1": 6}, map[string]bool{"b1 saw 10.1.0.2": true})
	})

	t.Run("a resync changes nothing", func(t *testing.T) {
		res := m.apply(t, tr)
		if res.IPVS.Writes != 0 || res.IPSets.Writes != 0 {
			t.Errorf("resync: %+v, want no IPVS or ipset writes", res)
		}
	})

	t.Run("HostAddresses leaves out the dummy interface", func(t *testing.T) {
		got, err := m.Binder.HostAddresses(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"10.1.0.1", "10.2.0.1", "10.2.1.1", "127.0.0.1", "::1"}, ipvsvm.AddrStrings(got)); diff != "" {
			t.Errorf("HostAddresses (-want +got):\n%s", diff)
		}
	})

	t.Run("Cleanup removes it all", func(t *testing.T) {
		err := m.Director.Do(func() error {
			return ipvsmode.Cleanup(ctx, ipvsmode.CleanupConfig{IPTables: []iptables.Interface{m.ipt}, IPSets: m.sets, IPVS: m.IFace, Binder: m.Binder})
		})
		if err != nil {
			t.Fatal(err)
		}
		if list, err := m.IFace.ListVirtualServers(ctx); err != nil || len(list) != 0 {
			t.Errorf("virtual servers left: %v (%v)", list, err)
		}
		infos, err := m.sets.ListSets(ctx)
		if err != nil || len(infos) != 0 {
			t.Errorf("sets left: %v (%v)", infos, err)
		}
		for _, table := range []iptables.Table{iptables.TableNAT, iptables.TableFilter} {
			var buf bytes.Buffer
			if err := m.Director.Do(func() error { return m.ipt.SaveInto(ctx, table, &buf) }); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(buf.String(), "KUBE-") {
				t.Errorf("%s table after Cleanup:\n%s", table, buf.String())
			}
		}
		if _, err := m.Binder.Addresses(ctx, ipvs.DummyDevice); !ipvs.IsNotFound(err) {
			t.Errorf("%s after Cleanup: %v", ipvs.DummyDevice, err)
		}
		if _, err := kerneltest.Dial(m.Client, "tcp", netip.MustParseAddrPort("10.96.0.10:80"), time.Second); err == nil {
			t.Error("the cluster IP still answers")
		}
	})
}

// TestVMModeDualStack applies both families' translations, with a member
// in every set and every rule the translator writes, to the kernel: the
// real ip6tables-legacy-restore, the kernel's set matches and IPVS must
// accept all of it. Then Cleanup removes all of it.
func TestVMModeDualStack(t *testing.T) {
	d, iface, binder := ipvsvm.NS(t)
	kerneltest.Require(t, "iptables-legacy-restore", "ip6tables-legacy-restore")
	ctx := context.Background()
	lock := filepath.Join(t.TempDir(), "xtables.lock")
	var ipts []iptables.Interface
	for _, p := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		err := d.Do(func() error {
			ipt, err := iptables.New(ctx, p, iptables.WithBackend(iptables.BackendLegacy), iptables.WithLockFile(lock))
			ipts = append(ipts, ipt)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	sets, err := ipset.New(ipset.WithNetNSPath("/run/netns/" + d.Name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sets.Close)

	// One of each kind of service, per family.
	every := func(a map[string]string) []svcPort {
		local := endpoint{ip: a["pod1"], local: true}
		remote := endpoint{ip: a["pod2"]}
		return []svcPort{
			{name: "default/web", clusterIP: a["web"], port: 80, nodePort: 30080, externalIPs: []string{a["ext1"]},
				lbVIPs: []string{a["vip1"]}, sourceRanges: []string{a["range"], a["nodeRange"]}, endpoints: []endpoint{local, remote}},
			{name: "default/local", clusterIP: a["local"], port: 80, nodePort: 30081, externalIPs: []string{a["ext2"]},
				lbVIPs: []string{a["vip2"]}, etpLocal: true, hcNodePort: 32000, endpoints: []endpoint{local, remote}},
			{name: "default/dns", proto: v1.ProtocolUDP, clusterIP: a["dns"], port: 53, nodePort: 30053, etpLocal: true, endpoints: []endpoint{{ip: a["pod1"], port: 53, local: true}}},
			{name: "default/sig", proto: v1.ProtocolSCTP, clusterIP: a["sig"], port: 9000, nodePort: 30900, etpLocal: true, endpoints: []endpoint{{ip: a["pod1"], port: 9000, local: true}}},
		}
	}
	cfg4 := ipvsmode.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: nodeName, ClusterCIDRs: []netip.Prefix{prefix("10.244.0.0/16")}}, RandomFully: ipts[0].HasRandomFully()}
	// Without a cluster CIDR: the src,dst variant of the masquerade rule.
	cfg6 := ipvsmode.WriterConfig{Family: v1.IPv6Protocol, Node: proxy.NodeConfig{Name: nodeName}, Scheduler: "sh", SchedulerFlags: ipvs.FlagSched1}
	t4 := translateWith(t, cfg4, []netip.Addr{addr("10.1.0.1")}, every(map[string]string{
		"web": "10.96.0.10", "local": "10.96.0.11", "dns": "10.96.0.53", "sig": "10.96.0.20",
		"ext1": "203.0.113.5", "ext2": "203.0.113.6", "vip1": "198.51.100.10", "vip2": "198.51.100.11",
		"pod1": "10.244.1.5", "pod2": "10.244.2.7", "range": "203.0.113.0/24", "nodeRange": "10.1.0.0/24",
	})...)
	t6 := translateWith(t, cfg6, []netip.Addr{addr("fd00:1::1")}, every(map[string]string{
		"web": "fd00:96::10", "local": "fd00:96::11", "dns": "fd00:96::53", "sig": "fd00:96::20",
		"ext1": "2001:db8:203::5", "ext2": "2001:db8:203::6", "vip1": "2001:db8:198::10", "vip2": "2001:db8:198::11",
		"pod1": "fd00:244:1::5", "pod2": "fd00:244:2::7", "range": "2001:db8:203::/64", "nodeRange": "fd00:1::/64",
	})...)
	for _, tr := range []ipvsmode.SyncResult{t4, t6} {
		for _, s := range tr.Sets {
			if len(s.Entries) == 0 {
				t.Errorf("%s has no member: the test misses a rule", s.Set.Name)
			}
		}
	}

	a := ipvsmode.NewApplier(ipvs.NewReconciler(iface, binder), ipset.NewReconciler(sets, ipvsmode.SetPrefix), ipts...)
	var res ipvsmode.ApplyResult
	err = d.Do(func() (err error) {
		res, err = a.Apply(ctx, t4, t6)
		return err
	})
	if err != nil {
		t.Fatalf("Apply: %v\n%s\n%s", err, t4.Payload, t6.Payload)
	}
	if want := len(t4.Services) + len(t6.Services); res.IPVS.VirtualServersAdded != want || res.IPSets.Created != len(t4.Sets)+len(t6.Sets) {
		t.Errorf("Apply: %+v, want %d virtual servers and %d sets created", res, want, len(t4.Sets)+len(t6.Sets))
	}
	for i, tr := range []ipvsmode.SyncResult{t4, t6} {
		var buf bytes.Buffer
		if err := d.Do(func() error { return ipts[i].SaveInto(ctx, iptables.TableFilter, &buf) }); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(buf.String(), "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set "+tr.Sets[len(tr.Sets)-1].Set.Name+" dst -j REJECT") {
			t.Errorf("%s filter table:\n%s", tr.Family, buf.String())
		}
	}

	err = d.Do(func() error {
		return ipvsmode.Cleanup(ctx, ipvsmode.CleanupConfig{IPTables: ipts, IPSets: sets, IPVS: iface, Binder: binder})
	})
	if err != nil {
		t.Fatal(err)
	}
	if list, _ := iface.ListVirtualServers(ctx); len(list) != 0 {
		t.Errorf("virtual servers left: %v", list)
	}
	if infos, _ := sets.ListSets(ctx); len(infos) != 0 {
		t.Errorf("sets left: %v", infos)
	}
}
