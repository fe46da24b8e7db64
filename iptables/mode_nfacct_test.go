package iptables_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/metricstest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/proxy"
)

// TestModeNFAcct checks WithNFAcct on fakes: the Modes of two families on
// one proxy.Metrics register the two counter metrics once; a counter that
// cannot be made is named by no rule and missing from the scrape, while
// the other is counted and exported; and the next sync tries the missing
// counter again.
func TestModeNFAcct(t *testing.T) {
	ctx := context.Background()
	acct := iptablestest.NewNFAcct()
	acct.Refuse(iptables.NFAcctLocalhostNodePorts, true)
	m := metricstest.NewRegistry()
	fake := iptablestest.NewFake()
	var modes []*iptables.Mode
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		b, err := iptables.NewMode(ctx, iptables.WriterConfig{Family: family, Node: proxy.NodeConfig{Name: "node-a"}, LocalhostNodePorts: true},
			fake, iptables.WithNFAcct(acct), iptables.WithMetrics(m.Metrics))
		if err != nil {
			t.Fatalf("%s: %v", family, err)
		}
		modes = append(modes, b)
	}
	if _, err := modes[0].Sync(ctx, []*proxy.FamilyInput{{Family: v1.IPv4Protocol}}); err != nil {
		t.Fatal(err)
	}
	var save bytes.Buffer
	if err := fake.SaveInto(ctx, iptables.TableFilter, &save); err != nil {
		t.Fatal(err)
	}
	if want := "--ctstate INVALID -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP"; !strings.Contains(save.String(), want) {
		t.Errorf("filter table lacks %q:\n%s", want, save.String())
	}
	acct.Count(iptables.NFAcctInvalidDropped, 7, 420)
	got := map[string]float64{
		"kubeproxy_iptables_ct_state_invalid_dropped_packets_total":     m.Value(t, "kubeproxy_iptables_ct_state_invalid_dropped_packets_total"),
		"kubeproxy_iptables_localhost_nodeports_accepted_packets_total": m.Value(t, "kubeproxy_iptables_localhost_nodeports_accepted_packets_total"),
	}
	want := map[string]float64{
		"kubeproxy_iptables_ct_state_invalid_dropped_packets_total":     7,
		"kubeproxy_iptables_localhost_nodeports_accepted_packets_total": 0, // not made: no series
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
	if n := len(m.Series(t, "kubeproxy_iptables_localhost_nodeports_accepted_packets_total")); n != 0 {
		t.Errorf("the counter that could not be made has %d series, want none", n)
	}

	// Once it can be made, the next sync makes it (the first did not).
	acct.Refuse(iptables.NFAcctLocalhostNodePorts, false)
	if _, err := modes[0].Sync(ctx, []*proxy.FamilyInput{{Family: v1.IPv4Protocol}}); err != nil {
		t.Fatal(err)
	}
	if _, err := acct.Get(ctx, iptables.NFAcctLocalhostNodePorts); err != nil {
		t.Error("the localhost counter was not made at the next sync")
	}
}
