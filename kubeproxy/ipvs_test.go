package kubeproxy

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvs/ipvstest"
	"github.com/proxykit/proxykit/ipvsmode"
)

// ipvsSettingsConfig is an IPVS-mode Config with excluded CIDRs, strict
// ARP and one timeout.
func ipvsSettingsConfig() *Config {
	return &Config{
		Mode:             ModeIPVS,
		IPVSExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.200.0.0/16")},
		IPVSTuning:       ipvsmode.Tuning{StrictARP: true, Timeouts: ipvs.Timeouts{TCP: time.Hour}},
	}
}

// withARP gives the fake node's kernel its arp sysctls, at the kernel's
// defaults.
func (f *fakeHost) withARP(t *testing.T) {
	t.Helper()
	for _, name := range []string{"arp_ignore", "arp_announce"} {
		path := filepath.Join(f.root, "proc/sys/net/ipv4/conf/all", name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// ipvsNodeState is what the IPVS settings change on a fake node.
type ipvsNodeState struct {
	ARPIgnore, ARPAnnounce string
	Timeouts               ipvs.Timeouts
	// VirtualServers are the addresses of the virtual servers.
	VirtualServers []string
}

func (f *fakeHost) ipvsState(t *testing.T) ipvsNodeState {
	t.Helper()
	to, err := f.lb.Timeouts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	list, err := f.lb.ListVirtualServers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s := ipvsNodeState{ARPIgnore: f.sysctl(t, "net/ipv4/conf/all/arp_ignore"), ARPAnnounce: f.sysctl(t, "net/ipv4/conf/all/arp_announce"), Timeouts: to}
	for _, vs := range list {
		s.VirtualServers = append(s.VirtualServers, vs.Address.String())
	}
	slices.Sort(s.VirtualServers)
	return s
}

// TestIPVSModeSettings: in IPVS mode, a proxier sets strict ARP and the
// timeouts it is given, its syncs delete the virtual servers it does not
// want but those in the excluded CIDRs, and so does Cleanup.
func TestIPVSModeSettings(t *testing.T) {
	ctx := context.Background()
	f, host := newFakeHost(t)
	f.withIPVS(t)
	f.withARP(t)
	for _, a := range []string{"10.200.0.5", "10.201.0.5"} {
		if err := f.lb.AddVirtualServer(ctx, ipvs.VirtualServer{Address: netip.MustParseAddr(a), Protocol: v1.ProtocolTCP, Port: 80}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := ipvsSettingsConfig()
	p, err := New(cluster(), "node-a", cfg, WithHost(host))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	tuned := ipvs.Timeouts{TCP: time.Hour, TCPFin: ipvstest.DefaultTimeouts.TCPFin, UDP: ipvstest.DefaultTimeouts.UDP}
	want := ipvsNodeState{ARPIgnore: "1", ARPAnnounce: "2", Timeouts: tuned, VirtualServers: []string{"10.200.0.5", "10.96.0.10"}}
	if diff := cmp.Diff(want, f.ipvsState(t)); diff != "" {
		t.Errorf("after a sync (-want +got):\n%s", diff)
	}

	if err := Cleanup(ctx, cfg, WithHost(host)); err != nil {
		t.Fatal(err)
	}
	want.VirtualServers = []string{"10.200.0.5"}
	if diff := cmp.Diff(want, f.ipvsState(t)); diff != "" {
		t.Errorf("after Cleanup (-want +got):\n%s", diff)
	}
}

// TestInitNodeIPVS: InitNode in IPVS mode sets strict ARP and the
// timeouts, and without them leaves the sysctls and timeouts alone.
func TestInitNodeIPVS(t *testing.T) {
	tuned := ipvs.Timeouts{TCP: time.Hour, TCPFin: ipvstest.DefaultTimeouts.TCPFin, UDP: ipvstest.DefaultTimeouts.UDP}
	for _, tc := range []struct {
		name string
		cfg  *Config
		want ipvsNodeState
	}{
		{"set", ipvsSettingsConfig(), ipvsNodeState{ARPIgnore: "1", ARPAnnounce: "2", Timeouts: tuned}},
		{"unset", &Config{Mode: ModeIPVS}, ipvsNodeState{ARPIgnore: "0", ARPAnnounce: "0", Timeouts: ipvstest.DefaultTimeouts}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, host := newFakeHost(t)
			f.withIPVS(t)
			f.withARP(t)
			if err := InitNode(context.Background(), tc.cfg, WithHost(host)); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, f.ipvsState(t)); diff != "" {
				t.Errorf("after InitNode (-want +got):\n%s", diff)
			}
		})
	}
}

// TestIPVSStrictARPFailure: a strict ARP that cannot be set fails the
// start, naming it.
func TestIPVSStrictARPFailure(t *testing.T) {
	f, host := newFakeHost(t)
	f.withIPVS(t)
	err := InitNode(context.Background(), &Config{Mode: ModeIPVS, IPVSTuning: ipvsmode.Tuning{StrictARP: true}}, WithHost(host))
	if err == nil || !strings.Contains(err.Error(), "strict ARP") || !strings.Contains(err.Error(), "arp_ignore") {
		t.Errorf("InitNode without the arp sysctls: %v, want an error naming strict ARP and arp_ignore", err)
	}
}
