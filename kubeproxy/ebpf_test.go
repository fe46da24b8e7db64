package kubeproxy

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/ebpf/ebpftest"
)

// pinnedEBPF is a fake bpffs for ebpf mode: the maps pinned, by family,
// and what the Host's ebpf calls were given.
type pinnedEBPF struct {
	maps     map[v1.IPFamily]*ebpftest.Fake
	opened   []ebpf.DatapathConfig
	cleanups int
}

// withEBPF gives host a fake bpffs: OpenEBPF takes over the maps of a
// family pinned before, as ebpf.Open does, and CleanupEBPF removes them.
func withEBPF(host *Host) *pinnedEBPF {
	p := &pinnedEBPF{maps: map[v1.IPFamily]*ebpftest.Fake{}}
	host.OpenEBPF = func(cfg ebpf.DatapathConfig) (ebpf.Maps, error) {
		p.opened = append(p.opened, cfg)
		if p.maps[cfg.Family] == nil {
			p.maps[cfg.Family] = ebpftest.NewFake(cfg.Family, cfg.Sizes)
		}
		return p.maps[cfg.Family], nil
	}
	host.CleanupEBPF = func(cfg ebpf.DatapathConfig) (bool, error) {
		p.cleanups++
		found := len(p.maps) > 0
		clear(p.maps)
		return found, nil
	}
	return p
}

// routes is the IPv4 maps' routes, "" when none are pinned.
func (p *pinnedEBPF) routes() string {
	if fk := p.maps[v1.IPv4Protocol]; fk != nil {
		return ebpftest.Routes(fk.State())
	}
	return ""
}

// TestEBPFMode: ebpf mode programs the Service into both nftables mode's
// table (for packets from outside the node) and the socket load
// balancer's maps of the configured cgroup and pins; nftables mode, after
// it, removes the socket load balancer, and so does Cleanup.
func TestEBPFMode(t *testing.T) {
	f, host := newFakeHost(t)
	pins := withEBPF(host)
	ctx := context.Background()
	cfg := &Config{Mode: ModeEBPF, EBPF: EBPFConfig{CgroupPath: "/sys/fs/cgroup", PinPath: "/sys/fs/bpf/test", NamePrefix: "p"}}
	p, err := New(cluster(), "node-a", cfg, WithHost(host))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	want := []ebpf.DatapathConfig{{Family: v1.IPv4Protocol, CgroupPath: "/sys/fs/cgroup", PinPath: "/sys/fs/bpf/test", NamePrefix: "p"}}
	if diff := cmp.Diff(want, pins.opened); diff != "" {
		t.Errorf("datapaths opened (-want +got):\n%s", diff)
	}
	if got, want := pins.routes(), "10.96.0.10:80/TCP flags=0 affinity=0: 10.244.1.10:8080*1\n"; got != want {
		t.Errorf("socket load balancer's routes:\n%s\nwant:\n%s", got, want)
	}
	if nft := f.nft[knftables.IPv4Family].Dump(); !strings.Contains(nft, "10.96.0.10 . tcp . 80") {
		t.Errorf("nftables mode beside it does not serve the Service:\n%s", nft)
	}

	// nftables mode alone, after it, removes the socket load balancer.
	p, err = New(cluster(), "node-a", &Config{Mode: ModeNFTables}, WithHost(host))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := pins.routes(); got != "" || pins.cleanups == 0 {
		t.Errorf("after nftables mode: %d cleanups, routes left:\n%s", pins.cleanups, got)
	}

	// ebpf mode again, then Cleanup.
	p, err = New(cluster(), "node-a", cfg, WithHost(host))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if err := Cleanup(ctx, &Config{}, WithHost(host)); err != nil {
		t.Fatal(err)
	}
	if got := pins.routes(); got != "" {
		t.Errorf("after Cleanup, routes left:\n%s", got)
	}
}

// TestEBPFModeNeedsCgroup: outside a dry run, ebpf mode refuses to start
// without a cgroup, before it touches anything; a dry run prints
// nftables mode's transactions, then the socket load balancer's maps.
func TestEBPFModeNeedsCgroup(t *testing.T) {
	_, host := newFakeHost(t)
	pins := withEBPF(host)
	p, err := New(cluster(), "node-a", &Config{Mode: ModeEBPF}, WithHost(host))
	if err == nil {
		err = p.RunOnce(context.Background())
	}
	if err == nil || !strings.Contains(err.Error(), "CgroupPath") {
		t.Errorf("ebpf mode without a cgroup: %v, want an error naming CgroupPath", err)
	}
	if len(pins.opened) != 0 {
		t.Errorf("opened %v", pins.opened)
	}

	var out bytes.Buffer
	p, err = New(cluster(), "node-a", &Config{Mode: ModeEBPF}, WithHost(untouchable(t)), WithDryRun(&out))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	nft, maps := strings.Index(out.String(), "10.96.0.10 . tcp . 80"), strings.Index(out.String(), "\nservice 10.96.0.10:80/TCP -> ")
	if nft < 0 || maps < nft {
		t.Errorf("the dry run does not print nftables mode's element, then the socket load balancer's:\n%s", out.String())
	}
}
