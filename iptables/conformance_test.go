package iptables_test

import (
	"context"
	"errors"
	"regexp"
	"sync/atomic"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/proxy"
	"github.com/proxykit/proxykit/proxy/proxytest"
)

// failingIPT is an iptablestest.Fake whose next restore fails, refused
// as a whole, when failNext is set.
type failingIPT struct {
	*iptablestest.Fake
	failNext atomic.Bool
}

func (f *failingIPT) RestoreAll(ctx context.Context, data []byte, flush iptables.FlushFlag, counters iptables.RestoreCountersFlag) error {
	if f.failNext.Swap(false) {
		return errors.New("iptables-restore: failed on purpose")
	}
	return f.Fake.RestoreAll(ctx, data, flush, counters)
}

func (f *failingIPT) Restore(ctx context.Context, t iptables.Table, data []byte, flush iptables.FlushFlag, counters iptables.RestoreCountersFlag) error {
	if f.failNext.Swap(false) {
		return errors.New("iptables-restore: failed on purpose")
	}
	return f.Fake.Restore(ctx, t, data, flush, counters)
}

// TestConformance runs proxytest's suite on the Backend of each family
// over an iptablestest.Fake, whose dump is the state compared.
func TestConformance(t *testing.T) {
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		t.Run(string(family), proxytest.Suite{
			Families: []v1.IPFamily{family},
			New: func(t testing.TB, node proxy.NodeConfig) (proxy.Backend, proxytest.Datapath) {
				_, ctx := ktesting.NewTestContext(t)
				fake := iptablestest.NewFake()
				if family == v1.IPv6Protocol {
					fake = iptablestest.NewIPv6Fake()
				}
				ipt := &failingIPT{Fake: fake}
				b, err := iptables.NewMode(ctx, iptables.WriterConfig{Family: family, Node: node}, ipt)
				if err != nil {
					t.Fatal(err)
				}
				return b, proxytest.Datapath{
					Dump:          func() string { return sortServiceRules(fake.Dump()) },
					FailNextApply: func() { ipt.failNext.Store(true) },
					// As iptables -F and -X of every table would.
					Wipe: func() {
						if err := fake.ParseDump(""); err != nil {
							t.Fatal(err)
						}
					},
				}
			},
		}.Run)
	}
}

// serviceRule matches a rule of one service port in a top-level chain: its
// comment starts with the port's namespace/name.
var serviceRule = regexp.MustCompile(`^-A (KUBE-SERVICES|KUBE-NODEPORTS|KUBE-EXTERNAL-SERVICES|KUBE-PROXY-FIREWALL) .*--comment "?[^" ]+/[^" ]+`)

// sortServiceRules sorts, in each top-level chain of dump, every run of
// consecutive rules of service ports. A partial sync inserts a new port's
// rules at the head of such a chain (or appends them), where a full sync
// writes them in the order of the ports' names; the order does not
// matter, as the rules of two ports never match the same packet. Every
// other rule keeps its place: the order of the rules in a port's own
// chains (KUBE-SVC-*, KUBE-SEP-*, ...) is compared as it is.
func sortServiceRules(dump string) string {
	return proxytest.SortRuns(dump, func(line string) string {
		if m := serviceRule.FindStringSubmatch(line); m != nil {
			return m[1]
		}
		return ""
	})
}
