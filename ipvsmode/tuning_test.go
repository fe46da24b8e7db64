package ipvsmode_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipset/ipsettest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvs/ipvstest"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/kernel"
	"github.com/proxykit/proxykit/proxy"
	"github.com/proxykit/proxykit/proxy/proxytest"
)

// arpRoot is a kernel root whose arp sysctls are at the kernel's
// defaults, 0.
func arpRoot(t *testing.T) *kernel.Kernel {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "proc/sys/net/ipv4/conf/all")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"arp_ignore", "arp_announce"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return &kernel.Kernel{Root: root}
}

// TestTune checks that Tune sets the strict-ARP sysctls and the IPVS
// timeouts asked for, and nothing else, and that it refuses invalid
// timeouts before changing anything.
func TestTune(t *testing.T) {
	type state struct {
		ARPIgnore, ARPAnnounce int
		Timeouts               ipvs.Timeouts
		TimeoutWrites          int
	}
	untouched := state{Timeouts: ipvstest.DefaultTimeouts}
	for _, tc := range []struct {
		name    string
		tuning  ipvsmode.Tuning
		nilIPVS bool
		want    state
		wantErr string
	}{
		{name: "zero", tuning: ipvsmode.Tuning{}, want: untouched},
		{name: "zero without an IPVS table", tuning: ipvsmode.Tuning{}, nilIPVS: true, want: untouched},
		{name: "strict ARP", tuning: ipvsmode.Tuning{StrictARP: true}, nilIPVS: true,
			want: state{ARPIgnore: 1, ARPAnnounce: 2, Timeouts: ipvstest.DefaultTimeouts}},
		{name: "one timeout", tuning: ipvsmode.Tuning{Timeouts: ipvs.Timeouts{TCPFin: 30 * time.Second}},
			want: state{Timeouts: ipvs.Timeouts{TCP: 900 * time.Second, TCPFin: 30 * time.Second, UDP: 300 * time.Second}, TimeoutWrites: 1}},
		{name: "everything", tuning: ipvsmode.Tuning{StrictARP: true, Timeouts: ipvs.Timeouts{TCP: time.Hour, TCPFin: time.Minute, UDP: 10 * time.Second}},
			want: state{ARPIgnore: 1, ARPAnnounce: 2, Timeouts: ipvs.Timeouts{TCP: time.Hour, TCPFin: time.Minute, UDP: 10 * time.Second}, TimeoutWrites: 1}},
		{name: "a negative timeout", tuning: ipvsmode.Tuning{StrictARP: true, Timeouts: ipvs.Timeouts{UDP: -time.Second}},
			want: untouched, wantErr: "udp timeout -1s"},
		{name: "a fraction of a second", tuning: ipvsmode.Tuning{Timeouts: ipvs.Timeouts{TCP: 1500 * time.Millisecond}},
			want: untouched, wantErr: "tcp timeout 1.5s"},
		{name: "timeouts without an IPVS table", tuning: ipvsmode.Tuning{Timeouts: ipvs.Timeouts{TCP: time.Hour}}, nilIPVS: true,
			want: untouched, wantErr: "connection timeouts: no IPVS table"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := arpRoot(t)
			fake := ipvstest.NewFake()
			var iface ipvs.Interface = fake
			if tc.nilIPVS {
				iface = nil
			}
			err := ipvsmode.Tune(context.Background(), k, iface, tc.tuning)
			if tc.wantErr == "" && err != nil {
				t.Fatal(err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("got error %v, want one with %q", err, tc.wantErr)
			}
			var got state
			if got.ARPIgnore, err = k.ReadSysctlInt(kernel.SysctlARPIgnore); err != nil {
				t.Fatal(err)
			}
			if got.ARPAnnounce, err = k.ReadSysctlInt(kernel.SysctlARPAnnounce); err != nil {
				t.Fatal(err)
			}
			if got.Timeouts, err = fake.Timeouts(context.Background()); err != nil {
				t.Fatal(err)
			}
			got.TimeoutWrites = fake.Counts().SetTimeouts
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("after Tune (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTuneNamesTheSysctl checks that a kernel without the arp sysctls
// fails strict ARP with an error naming the one that could not be set.
func TestTuneNamesTheSysctl(t *testing.T) {
	k := &kernel.Kernel{Root: t.TempDir()}
	err := ipvsmode.Tune(context.Background(), k, nil, ipvsmode.Tuning{StrictARP: true})
	if err == nil || !strings.Contains(err.Error(), "strict ARP") || !strings.Contains(err.Error(), kernel.SysctlARPIgnore) {
		t.Errorf("got %v, want an error naming strict ARP and %s", err, kernel.SysctlARPIgnore)
	}
}

// TestModeExcludeCIDRs checks that a Mode's sync deletes the virtual
// servers it does not want, except those in the excluded CIDRs.
func TestModeExcludeCIDRs(t *testing.T) {
	vs := func(addr string) ipvs.VirtualServer {
		return ipvs.VirtualServer{Address: netip.MustParseAddr(addr), Protocol: v1.ProtocolTCP, Port: 80, Scheduler: "rr"}.Normalized()
	}
	sortVS := cmpopts.SortSlices(func(a, b ipvs.VirtualServer) bool { return a.Address.Less(b.Address) })
	others := []ipvs.VirtualServer{vs("10.200.0.5"), vs("10.201.0.5"), vs("fd00:200::5")}
	for _, tc := range []struct {
		name    string
		exclude []netip.Prefix
		want    []ipvs.VirtualServer
	}{
		{name: "none excluded", want: nil},
		{name: "one CIDR", exclude: []netip.Prefix{netip.MustParsePrefix("10.200.0.0/16")}, want: []ipvs.VirtualServer{vs("10.200.0.5")}},
		{name: "both families", exclude: []netip.Prefix{netip.MustParsePrefix("10.200.0.0/16"), netip.MustParsePrefix("fd00:200::/64")},
			want: []ipvs.VirtualServer{vs("10.200.0.5"), vs("fd00:200::5")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			lb, sets := ipvstest.NewFake(), ipsettest.NewFake()
			for _, v := range others {
				if err := lb.AddVirtualServer(ctx, v); err != nil {
					t.Fatal(err)
				}
			}
			binder := hostBinder{Binder: ipvstest.NewBinder(), addrs: []netip.Addr{netip.MustParseAddr("192.168.0.10")}}
			var cfgs []ipvsmode.WriterConfig
			var ipts []iptables.Interface
			for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
				cfgs = append(cfgs, ipvsmode.WriterConfig{Family: family, Node: proxy.NodeConfig{Name: nodeName}})
				fake := iptablestest.NewFake(iptablestest.WithIPSetFake(sets))
				if family == v1.IPv6Protocol {
					fake = iptablestest.NewIPv6Fake(iptablestest.WithIPSetFake(sets))
				}
				ipts = append(ipts, fake)
			}
			m, err := ipvsmode.NewMode(ctx, cfgs, &ipvsmode.Handles{IPVS: lb, Binder: binder, IPSets: sets}, ipts,
				ipvsmode.WithExcludeCIDRs(tc.exclude...))
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = m.Close() }()
			if _, err := m.Sync(ctx, []*proxy.FamilyInput{proxytest.Input(v1.IPv4Protocol), proxytest.Input(v1.IPv6Protocol)}); err != nil {
				t.Fatal(err)
			}
			got, err := lb.ListVirtualServers(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), sortVS, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("virtual servers after a sync that wants none (-want +got):\n%s", diff)
			}
		})
	}
}
