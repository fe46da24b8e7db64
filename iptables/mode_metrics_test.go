package iptables_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/proxy"
)

// restoreRecorder is a Fake that keeps the input of its last RestoreAll.
type restoreRecorder struct {
	*iptablestest.Fake
	last []byte
	// fail, if set, is returned by RestoreAll, which then applies nothing.
	fail error
}

func (r *restoreRecorder) RestoreAll(ctx context.Context, data []byte, flush iptables.FlushFlag, counters iptables.RestoreCountersFlag) error {
	r.last = bytes.Clone(data)
	if r.fail != nil {
		return r.fail
	}
	return r.Fake.RestoreAll(ctx, data, flush, counters)
}

// builtinChains are the chains iptables makes, whose rules (the writer's
// jumps) kube-proxy's rule gauges do not count.
var builtinChains = map[iptables.Chain]bool{
	"PREROUTING": true, "INPUT": true, "FORWARD": true, "OUTPUT": true, "POSTROUTING": true,
}

// heldRules counts the rules the fake holds in table outside the built-in
// chains: what sync_proxy_rules_iptables_total must say.
func heldRules(fake *iptablestest.Fake, table iptables.Table) float64 {
	n := 0
	for _, c := range fake.Chains(table) {
		if !builtinChains[c] {
			n += len(fake.Rules(table, c))
		}
	}
	return float64(n)
}

// writtenRules counts the rules the payload adds to table ("-A" and "-I"
// lines): what sync_proxy_rules_iptables_last must say.
func writtenRules(payload []byte, table iptables.Table) float64 {
	n := 0
	var in iptables.Table
	for _, line := range bytes.Split(payload, []byte("\n")) {
		switch {
		case bytes.HasPrefix(line, []byte("*")):
			in = iptables.Table(line[1:])
		case in == table && (bytes.HasPrefix(line, []byte("-A ")) || bytes.HasPrefix(line, []byte("-I "))):
			n++
		}
	}
	return float64(n)
}

// TestIPTablesModeRuleGauges checks kube-proxy's rule gauges after each
// kind of sync of a Mode over the fake: ..._iptables_total, by table and
// ip_family, equals the rules the fake holds in the writer's chains, and
// ..._iptables_last the rules the sync's payload added; a failed restore
// leaves both as they were.
func TestIPTablesModeRuleGauges(t *testing.T) {
	web := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: v1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
	}
	slice := func(addrs ...string) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		}
		for _, a := range addrs {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
		}
		return s
	}

	fake := iptablestest.NewFake()
	f := newFakeIPTablesFamily(t, fake)
	// The same metrics, through a Mode whose restores the test reads.
	rec := &restoreRecorder{Fake: fake}
	_, ctx := ktesting.NewTestContext(t)
	var err error
	f.b, err = iptables.NewMode(ctx, iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-a"}}, rec, iptables.WithMetrics(f.m.Metrics))
	if err != nil {
		t.Fatal(err)
	}

	for _, step := range []struct {
		name     string
		change   func()
		wantFull bool
		// wantNone says the sync writes nothing, so ..._last is 0.
		wantNone bool
	}{
		{name: "first sync", change: func() {}, wantFull: true},
		{name: "endpoint added", change: func() { f.epTracker.EndpointSliceUpdate(slice("10.244.0.11", "10.244.0.12"), false) }},
		{name: "nothing changed", change: func() {}, wantNone: true},
		{name: "full sync asked for", change: func() { f.fullNext = true }, wantFull: true},
		{name: "service deleted", change: func() { f.svcTracker.Update(web, nil) }},
	} {
		t.Run(step.name, func(t *testing.T) {
			rec.last = nil
			step.change()
			if full := f.sync(t); full != step.wantFull {
				t.Fatalf("full = %v, want %v", full, step.wantFull)
			}
			if (rec.last == nil) != step.wantNone {
				t.Fatalf("restored %q, want a restore: %v", rec.last, !step.wantNone)
			}
			want := map[string]map[string]float64{
				"kubeproxy_sync_proxy_rules_iptables_total": {
					"ip_family=IPv4,table=filter": heldRules(fake, iptables.TableFilter),
					"ip_family=IPv4,table=nat":    heldRules(fake, iptables.TableNAT),
				},
				"kubeproxy_sync_proxy_rules_iptables_last": {
					"ip_family=IPv4,table=filter": writtenRules(rec.last, iptables.TableFilter),
					"ip_family=IPv4,table=nat":    writtenRules(rec.last, iptables.TableNAT),
				},
			}
			got := map[string]map[string]float64{}
			for name := range want {
				got[name] = f.m.Series(t, name)
			}
			t.Logf("rule gauges: %v", got)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("rule gauges (-want +got):\n%s", diff)
			}
			if step.wantFull && cmp.Diff(want["kubeproxy_sync_proxy_rules_iptables_total"], got["kubeproxy_sync_proxy_rules_iptables_last"]) != "" {
				t.Errorf("a full sync writes every rule, but _last %v differs from _total %v", got["kubeproxy_sync_proxy_rules_iptables_last"], got["kubeproxy_sync_proxy_rules_iptables_total"])
			}
		})
	}

	// A failed restore applied nothing: the gauges keep the last applied
	// sync's values.
	before := map[string]map[string]float64{}
	for _, name := range []string{"kubeproxy_sync_proxy_rules_iptables_total", "kubeproxy_sync_proxy_rules_iptables_last"} {
		before[name] = f.m.Series(t, name)
	}
	rec.fail = errors.New("iptables-restore: line 2 failed")
	f.svcTracker.Update(nil, web)
	in := &proxy.FamilyInput{Family: v1.IPv4Protocol, Services: f.svcMap, Endpoints: f.epMap,
		ServiceChanges: f.svcMap.Update(f.svcTracker), EndpointChanges: f.epMap.Update(f.epTracker), NodeLabels: map[string]string{}}
	if _, err := f.b.Sync(ctx, []*proxy.FamilyInput{in}); err == nil {
		t.Fatal("Sync with a failing restore succeeded")
	}
	if len(rec.last) == 0 {
		t.Fatal("the failed sync restored nothing; the test does not test the failure")
	}
	after := map[string]map[string]float64{}
	for name := range before {
		after[name] = f.m.Series(t, name)
	}
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("rule gauges after a failed restore (-before +after):\n%s", diff)
	}
}
