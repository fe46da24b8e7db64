package ipvsmode_test

// kube-proxy's ipvs.strictARP, ipvs.excludeCIDRs and IPVS timeouts on a
// real kernel, in the VM tier only (see vm_linux_test.go).

import (
	"context"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/ipvsvm"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/kernel"
	"github.com/proxykit/proxykit/proxy"
	"github.com/proxykit/proxykit/proxy/proxytest"
)

// TestVMTune sets strict ARP and the IPVS timeouts in a namespace of its
// own and reads them back: the sysctls from that namespace's /proc/sys
// (those of the test's own namespace are unchanged), the timeouts with
// the IPVS netlink "get config" command. A second Tune with one timeout
// leaves the others as they are.
func TestVMTune(t *testing.T) {
	ns, iface, _ := ipvsvm.NS(t)
	ctx := context.Background()
	k := &kernel.Kernel{}
	arp := func() (ignore, announce int, err error) {
		if ignore, err = k.ReadSysctlInt(kernel.SysctlARPIgnore); err != nil {
			return 0, 0, err
		}
		announce, err = k.ReadSysctlInt(kernel.SysctlARPAnnounce)
		return ignore, announce, err
	}
	outIgnore, outAnnounce, err := arp()
	if err != nil {
		t.Fatal(err)
	}

	tuning := ipvsmode.Tuning{StrictARP: true, Timeouts: ipvs.Timeouts{TCP: time.Hour, TCPFin: 30 * time.Second, UDP: 45 * time.Second}}
	var ignore, announce int
	err = ns.Do(func() error {
		if err := ipvsmode.Tune(ctx, k, iface, tuning); err != nil {
			return err
		}
		ignore, announce, err = arp()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if ignore != 1 || announce != 2 {
		t.Errorf("in the namespace: arp_ignore %d, arp_announce %d; want 1 and 2", ignore, announce)
	}
	if i, a, err := arp(); err != nil || i != outIgnore || a != outAnnounce {
		t.Errorf("outside the namespace: arp_ignore %d, arp_announce %d (%v); want them unchanged, %d and %d", i, a, err, outIgnore, outAnnounce)
	}
	got, err := iface.Timeouts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got != tuning.Timeouts {
		t.Errorf("timeouts read back: %s, want %s", got, tuning.Timeouts)
	}

	// Zero fields leave the kernel's values, and no strict ARP leaves
	// the sysctls set.
	if err := ns.Do(func() error {
		return ipvsmode.Tune(ctx, k, iface, ipvsmode.Tuning{Timeouts: ipvs.Timeouts{UDP: 10 * time.Second}})
	}); err != nil {
		t.Fatal(err)
	}
	if got, err = iface.Timeouts(ctx); err != nil {
		t.Fatal(err)
	}
	if want := (ipvs.Timeouts{TCP: time.Hour, TCPFin: 30 * time.Second, UDP: 10 * time.Second}); got != want {
		t.Errorf("timeouts after setting udp alone: %s, want %s", got, want)
	}
	if err := ns.Do(func() (err error) { ignore, announce, err = arp(); return err }); err != nil {
		t.Fatal(err)
	}
	if ignore != 1 || announce != 2 {
		t.Errorf("after a Tune without strict ARP: arp_ignore %d, arp_announce %d; want them left at 1 and 2", ignore, announce)
	}
}

// TestVMExcludeCIDRs checks on the kernel that a Mode's sync and Cleanup
// delete the virtual servers they do not own, and leave those in the
// excluded CIDRs.
func TestVMExcludeCIDRs(t *testing.T) {
	ns, iface, binder := ipvsvm.NS(t)
	kerneltest.Require(t, "iptables-legacy", "iptables-legacy-save", "iptables-legacy-restore")
	ctx := context.Background()
	lock := filepath.Join(t.TempDir(), "xtables.lock")
	var ipt iptables.Interface
	if err := ns.Do(func() (err error) {
		ipt, err = iptables.New(ctx, v1.IPv4Protocol, iptables.WithBackend(iptables.BackendLegacy), iptables.WithLockFile(lock))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	sets, err := ipset.New(ipset.WithNetNSPath("/run/netns/" + ns.Name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sets.Close)

	vs := func(addr string) ipvs.VirtualServer {
		return ipvs.VirtualServer{Address: netip.MustParseAddr(addr), Protocol: v1.ProtocolTCP, Port: 80, Scheduler: "rr"}.Normalized()
	}
	add := func(addrs ...string) {
		t.Helper()
		for _, a := range addrs {
			if err := iface.AddVirtualServer(ctx, vs(a)); err != nil {
				t.Fatal(err)
			}
		}
	}
	expect := func(when string, want ...ipvs.VirtualServer) {
		t.Helper()
		got, err := iface.ListVirtualServers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
			cmpopts.SortSlices(func(a, b ipvs.VirtualServer) bool { return a.Address.Less(b.Address) })); diff != "" {
			t.Errorf("virtual servers %s (-want +got):\n%s", when, diff)
		}
	}
	exclude := []netip.Prefix{netip.MustParsePrefix("10.200.0.0/16")}

	add("10.200.0.5", "10.201.0.5")
	cfg := ipvsmode.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: nodeName}}
	m, err := ipvsmode.NewMode(ctx, []ipvsmode.WriterConfig{cfg}, &ipvsmode.Handles{IPVS: iface, Binder: binder, IPSets: sets},
		[]iptables.Interface{ipt}, ipvsmode.WithExcludeCIDRs(exclude...))
	if err != nil {
		t.Fatal(err)
	}
	if err := ns.Do(func() error {
		_, err := m.Sync(ctx, []*proxy.FamilyInput{proxytest.Input(v1.IPv4Protocol)})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	expect("after a sync", vs("10.200.0.5"))

	add("10.202.0.5")
	if err := ipvsmode.Cleanup(ctx, ipvsmode.CleanupConfig{IPVS: iface, ExcludeCIDRs: exclude}); err != nil {
		t.Fatal(err)
	}
	expect("after Cleanup", vs("10.200.0.5"))
}
