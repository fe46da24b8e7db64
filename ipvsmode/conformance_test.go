package ipvsmode_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipset/ipsettest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvs/ipvstest"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/proxy"
	"github.com/proxykit/proxykit/proxy/proxytest"
)

// hostBinder is an ipvstest.Binder on a host whose interfaces have addrs.
type hostBinder struct {
	*ipvstest.Binder
	addrs []netip.Addr
}

func (b hostBinder) HostAddresses(context.Context, string) ([]netip.Addr, error) { return b.addrs, nil }

// failingRestore is an iptablestest.Fake whose next restore fails when
// failNext is set.
type failingRestore struct {
	*iptablestest.Fake
	failNext *atomic.Bool
}

func (f failingRestore) RestoreAll(ctx context.Context, data []byte, flush iptables.FlushFlag, counters iptables.RestoreCountersFlag) error {
	if f.failNext.Swap(false) {
		return errors.New("iptables-restore: failed on purpose")
	}
	return f.Fake.RestoreAll(ctx, data, flush, counters)
}

func (f failingRestore) Restore(ctx context.Context, t iptables.Table, data []byte, flush iptables.FlushFlag, counters iptables.RestoreCountersFlag) error {
	if f.failNext.Swap(false) {
		return errors.New("iptables-restore: failed on purpose")
	}
	return f.Fake.Restore(ctx, t, data, flush, counters)
}

// TestConformance runs proxytest's suite on a Mode over fakes of IPVS,
// ipset and iptables, of each family alone and of both; the state
// compared is the fakes' dumps and the addresses bound to the dummy
// interface.
func TestConformance(t *testing.T) {
	for _, families := range [][]v1.IPFamily{{v1.IPv4Protocol}, {v1.IPv6Protocol}, {v1.IPv4Protocol, v1.IPv6Protocol}} {
		t.Run(fmt.Sprint(families), proxytest.Suite{
			Families: families,
			New: func(t testing.TB, node proxy.NodeConfig) (proxy.Backend, proxytest.Datapath) {
				lb, sets := ipvstest.NewFake(), ipsettest.NewFake()
				binder := hostBinder{Binder: ipvstest.NewBinder(), addrs: []netip.Addr{netip.MustParseAddr("192.168.0.10"), netip.MustParseAddr("fd00:1::10")}}
				var failNext atomic.Bool
				var cfgs []ipvsmode.WriterConfig
				var fakes []*iptablestest.Fake
				var ipts []iptables.Interface
				for _, family := range families {
					cfgs = append(cfgs, ipvsmode.WriterConfig{Family: family, Node: node})
					fake := iptablestest.NewFake(iptablestest.WithIPSetFake(sets))
					if family == v1.IPv6Protocol {
						fake = iptablestest.NewIPv6Fake(iptablestest.WithIPSetFake(sets))
					}
					fakes = append(fakes, fake)
					ipts = append(ipts, failingRestore{Fake: fake, failNext: &failNext})
				}
				m, err := ipvsmode.NewMode(context.Background(), cfgs, &ipvsmode.Handles{IPVS: lb, Binder: binder, IPSets: sets}, ipts)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = m.Close() })
				return m, proxytest.Datapath{
					Dump: func() string {
						// An error (no dummy interface yet) is part of the state.
						bound, err := binder.Addresses(context.Background(), ipvs.DummyDevice)
						out := []string{"# IPVS", lb.Dump(), "# ipsets", sets.Dump(), fmt.Sprint("# bound to ", ipvs.DummyDevice, ": ", bound, err)}
						for i, fake := range fakes {
							out = append(out, "# iptables "+string(families[i]), fake.Dump())
						}
						return strings.Join(out, "\n")
					},
					FailNextApply: func() { failNext.Store(true) },
					// As ipvsadm --clear would.
					Wipe: func() {
						if err := lb.Flush(context.Background()); err != nil {
							t.Fatal(err)
						}
					},
				}
			},
		}.Run)
	}
}
