package iptables_test

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/testkit/metricstest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/proxy"
	"github.com/proxykit/proxykit/proxy/proxytest"
)

// fakeIPTablesFamily is an iptables backend over a Fake with the trackers
// and maps that feed it, holding one service "ns/web" with one endpoint.
type fakeIPTablesFamily struct {
	b          *iptables.Mode
	svcTracker *changetracker.ServiceChangeTracker
	epTracker  *changetracker.EndpointsChangeTracker
	svcMap     changetracker.ServicePortMap
	epMap      changetracker.EndpointsMap
	fake       *iptablestest.Fake
	m          *metricstest.Registry
	// cidrs are the next syncs' FamilyInput.ServiceCIDRs.
	cidrs []netip.Prefix
	// fullNext is the next sync's FamilyInput.Full, set by lost as the
	// Proxier sets it.
	fullNext bool
}

func newFakeIPTablesFamily(t *testing.T, fake *iptablestest.Fake) *fakeIPTablesFamily {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	m := metricstest.NewRegistry()
	b, err := iptables.NewMode(ctx, iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-a"}}, fake, iptables.WithMetrics(m.Metrics))
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeIPTablesFamily{b: b, fake: fake, m: m,
		svcTracker: changetracker.NewServiceChangeTracker(v1.IPv4Protocol, nil),
		epTracker:  changetracker.NewEndpointsChangeTracker(v1.IPv4Protocol, "node-a", nil),
		svcMap:     changetracker.ServicePortMap{},
		epMap:      changetracker.EndpointsMap{},
	}
	f.svcTracker.Update(nil, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: v1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
	})
	f.epTracker.EndpointSliceUpdate(&discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.11"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}, false)
	return f
}

// sync runs one sync of the backend and reports whether it was full.
func (f *fakeIPTablesFamily) sync(t *testing.T) bool {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	in := &proxy.FamilyInput{
		Family:          v1.IPv4Protocol,
		Services:        f.svcMap,
		Endpoints:       f.epMap,
		ServiceChanges:  f.svcMap.Update(f.svcTracker),
		EndpointChanges: f.epMap.Update(f.epTracker),
		NodeLabels:      map[string]string{},
		ServiceCIDRs:    f.cidrs,
		Full:            f.fullNext,
	}
	f.fullNext = false
	outs, err := f.b.Sync(ctx, []*proxy.FamilyInput{in})
	if err != nil {
		t.Fatal(err)
	}
	return outs[0].Full
}

func natChains(t *testing.T, fake *iptablestest.Fake) []iptables.Chain {
	t.Helper()
	var buf bytes.Buffer
	if err := fake.SaveInto(context.Background(), iptables.TableNAT, &buf); err != nil {
		t.Fatal(err)
	}
	return iptables.ChainsFromSave(buf.Bytes())
}

func hasChain(chains []iptables.Chain, c iptables.Chain) bool {
	for _, x := range chains {
		if x == c {
			return true
		}
	}
	return false
}

// webJump returns the rule of nat KUBE-SERVICES that sends ns/web:http's
// cluster IP to its chain, as "KUBE-SERVICES <rule>".
func webJump(t *testing.T, fake *iptablestest.Fake) string {
	t.Helper()
	var buf bytes.Buffer
	if err := fake.ListRules(context.Background(), iptables.TableNAT, iptables.KubeServicesChain, &buf); err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(buf.String()) {
		if strings.Contains(line, "ns/web:http cluster IP") {
			return strings.TrimSpace(strings.TrimPrefix(line, "-A "))
		}
	}
	t.Fatalf("no jump for ns/web:http in:\n%s", buf.String())
	return ""
}

// TestIPTablesBackendDriftCheck checks that the backend's drift check
// calls lost, and counts a repair, exactly when a service's jump has been
// deleted, and that the full sync lost brings puts the jump back.
func TestIPTablesBackendDriftCheck(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFakeIPTablesFamily(t, iptablestest.NewFake())
	if !f.sync(t) {
		t.Fatal("first sync partial")
	}
	losses := 0
	lost := func() { losses++; f.fullNext = true }
	f.b.CheckDrift(ctx, lost)
	if losses != 0 {
		t.Fatalf("lost called %d times with nothing changed", losses)
	}

	jump := webJump(t, f.fake)
	if err := f.fake.Restore(ctx, iptables.TableNAT, []byte("*nat\n-D "+jump+"\nCOMMIT\n"), iptables.NoFlushTables, iptables.NoRestoreCounters); err != nil {
		t.Fatal(err)
	}
	f.b.CheckDrift(ctx, lost)
	if losses != 1 {
		t.Fatalf("lost called %d times after the jump was deleted, want 1", losses)
	}
	if got := f.m.Value(t, "kubeproxy_sync_proxy_rules_iptables_drift_repairs_total"); got != 1 {
		t.Errorf("drift repairs %v, want 1", got)
	}
	if !f.sync(t) {
		t.Error("the sync after drift was partial")
	}
	var buf bytes.Buffer
	if err := f.fake.ListRules(ctx, iptables.TableNAT, iptables.KubeServicesChain, &buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "ns/web:http cluster IP") {
		t.Errorf("the jump is still missing after the full sync:\n%s", buf.String())
	}
	f.b.CheckDrift(ctx, lost)
	if losses != 1 {
		t.Errorf("lost called again after the repair")
	}
}

// failingSaveIPT fails every save of nat, as iptables-nft-save of a large
// table does when the stack runs out.
type failingSaveIPT struct{ *iptablestest.Fake }

func (f failingSaveIPT) SaveInto(ctx context.Context, table iptables.Table, buf *bytes.Buffer) error {
	if table == iptables.TableNAT {
		return errors.New("iptables-nft-save: killed")
	}
	return f.Fake.SaveInto(ctx, table, buf)
}

// TestIPTablesBackendDriftCheckServiceChains checks that the drift check
// sees what was changed inside a service's chains (an endpoint chain
// flushed by hand) and brings the full sync that refills them, and that
// when reading those chains fails, drift in the top-level chains is still
// repaired.
func TestIPTablesBackendDriftCheckServiceChains(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	web := changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web"}, Port: "http", Protocol: v1.ProtocolTCP}
	sep := iptables.DefaultChainNames().Endpoint(web, "10.244.0.11:8080")

	f := newFakeIPTablesFamily(t, iptablestest.NewFake())
	if !f.sync(t) {
		t.Fatal("first sync partial")
	}
	if err := f.fake.FlushChain(ctx, iptables.TableNAT, sep); err != nil {
		t.Fatal(err)
	}
	losses := 0
	lost := func() { losses++; f.fullNext = true }
	f.b.CheckDrift(ctx, lost)
	if losses != 1 {
		t.Fatalf("lost called %d times after %s was flushed, want 1", losses, sep)
	}
	if !f.sync(t) {
		t.Error("the sync after drift was partial")
	}
	if got := f.fake.Rules(iptables.TableNAT, sep); len(got) != 2 {
		t.Errorf("%s after the repair: %q, want its two rules", sep, got)
	}

	g := newFakeIPTablesFamily(t, iptablestest.NewFake())
	g.b.SetInterface(failingSaveIPT{g.fake})
	if !g.sync(t) {
		t.Fatal("first sync partial")
	}
	jump := webJump(t, g.fake)
	if err := g.fake.Restore(ctx, iptables.TableNAT, []byte("*nat\n-D "+jump+"\nCOMMIT\n"), iptables.NoFlushTables, iptables.NoRestoreCounters); err != nil {
		t.Fatal(err)
	}
	losses = 0
	lost = func() { losses++; g.fullNext = true }
	g.b.CheckDrift(ctx, lost)
	if losses != 1 {
		t.Errorf("lost called %d times after a jump was deleted and the save of nat failed, want 1", losses)
	}
}

// TestIPTablesBackendStaleChainsAtStart checks that a backend made over
// tables holding the chains of a service that no longer exists (left by a
// proxier that ran before) deletes them in its first sync, and keeps the
// chains of the live service.
func TestIPTablesBackendStaleChainsAtStart(t *testing.T) {
	ctx := context.Background()
	fake := iptablestest.NewFake()
	gone := changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "gone"}, Port: "http", Protocol: v1.ProtocolTCP}
	svc, sep := iptables.DefaultChainNames().ServiceCluster(gone), iptables.DefaultChainNames().Endpoint(gone, "10.244.0.99:8080")
	stale := "*nat\n:" + string(svc) + " - [0:0]\n:" + string(sep) + " - [0:0]\n-A " + string(svc) + " -j " + string(sep) +
		"\n-A " + string(sep) + " -p tcp -j DNAT --to-destination 10.244.0.99:8080\nCOMMIT\n"
	if err := fake.Restore(ctx, iptables.TableNAT, []byte(stale), iptables.NoFlushTables, iptables.NoRestoreCounters); err != nil {
		t.Fatal(err)
	}
	f := newFakeIPTablesFamily(t, fake)
	f.sync(t)
	chains := natChains(t, fake)
	for _, c := range []iptables.Chain{svc, sep} {
		if hasChain(chains, c) {
			t.Errorf("stale chain %s is still there after the first sync", c)
		}
	}
	web := changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web"}, Port: "http", Protocol: v1.ProtocolTCP}
	for _, c := range []iptables.Chain{iptables.DefaultChainNames().ServiceCluster(web), iptables.DefaultChainNames().Endpoint(web, "10.244.0.11:8080")} {
		if !hasChain(chains, c) {
			t.Errorf("chain %s of the live service is missing", c)
		}
	}
}

// TestSyncRefusesOtherInputs checks that a iptables.Mode, which serves one
// family, fails a sync given another family's input or more than one, and
// still returns one result per input.
func TestSyncRefusesOtherInputs(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	b, err := iptables.NewMode(ctx, iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-a"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	v4, v6 := proxytest.Input(v1.IPv4Protocol), proxytest.Input(v1.IPv6Protocol)
	proxytest.SyncRefuses(ctx, t, b, [][]*proxy.FamilyInput{{v6}, {v4, v6}, {}})
	var out bytes.Buffer
	b, err = iptables.NewMode(ctx, iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-a"}}, nil, iptables.WithDryRun(&out))
	if err != nil {
		t.Fatal(err)
	}
	if outs, err := b.Sync(ctx, []*proxy.FamilyInput{v4}); err != nil || !outs[0].Full {
		t.Fatalf("first dry-run sync: %v, %+v; want a full one", err, outs)
	}
	if !strings.HasPrefix(out.String(), "# IPv4: iptables-restore input\n*") {
		t.Errorf("dry-run output starts %.60q, want the family's header and the tables", out.String())
	}
}

// TestIPTablesBackendPassesServiceCIDRs checks that the family's
// ServiceCIDRs reach the writer: ns/web (10.96.0.10) gets no chain while
// the ranges are known and do not hold it, and gets it back, in a full
// sync, when they are unknown again.
func TestIPTablesBackendPassesServiceCIDRs(t *testing.T) {
	web := changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web"}, Port: "http", Protocol: v1.ProtocolTCP}
	f := newFakeIPTablesFamily(t, iptablestest.NewFake())
	for _, step := range []struct {
		cidrs   []netip.Prefix
		wantWeb bool
	}{
		{cidrs: []netip.Prefix{netip.MustParsePrefix("10.97.0.0/16")}},
		{wantWeb: true},
		{cidrs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}, wantWeb: true},
	} {
		f.cidrs = step.cidrs
		if !f.sync(t) {
			t.Errorf("ranges %v: partial sync, want full", step.cidrs)
		}
		if got := hasChain(natChains(t, f.fake), iptables.DefaultChainNames().ServiceCluster(web)); got != step.wantWeb {
			t.Errorf("ranges %v: %s has its chain: %v, want %v", step.cidrs, web, got, step.wantWeb)
		}
	}
}
