package nftables

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/testkit/metricstest"
	"github.com/proxykit/proxykit/proxy"
	"github.com/proxykit/proxykit/proxy/proxytest"
)

// fakeFamily is an nftables backend over a Fake with the trackers and
// maps that feed it.
type fakeFamily struct {
	b          *Mode
	fake       *knftables.Fake
	svcTracker *changetracker.ServiceChangeTracker
	epTracker  *changetracker.EndpointsChangeTracker
	svcMap     changetracker.ServicePortMap
	epMap      changetracker.EndpointsMap
	m          *metricstest.Registry
	// fullNext is the next sync's FamilyInput.Full, set by lost as the
	// Proxier sets it.
	fullNext bool
}

func newMetrics() *metricstest.Registry { return metricstest.NewRegistry() }

// The full names of the metrics nftables mode registers.
const (
	syncFailuresMetric    = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
	cleanupFailuresMetric = "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total"
)

// tableExists is a TableLookup over a Fake.
func tableExists(fake *knftables.Fake) TableLookup {
	return func(context.Context) (bool, error) {
		fake.RLock()
		defer fake.RUnlock()
		return fake.Table != nil, nil
	}
}

func newFakeFamily(t *testing.T) *fakeFamily {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	fake := knftables.NewFake(knftables.IPv4Family, DefaultTableName)
	m := newMetrics()
	b, err := NewMode(ctx, WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-a"}}, fake, WithMetrics(m.Metrics), WithTableLookup(tableExists(fake)))
	if err != nil {
		t.Fatal(err)
	}
	f := familyOf(b, fake, m)
	f.addService("web", "10.96.0.10", "10.244.0.11")
	return f
}

// familyOf is a fakeFamily of b, which writes to fake (nil in a dry run)
// and counts on m, with empty trackers and maps.
func familyOf(b *Mode, fake *knftables.Fake, m *metricstest.Registry) *fakeFamily {
	return &fakeFamily{b: b, fake: fake, m: m,
		svcTracker: changetracker.NewServiceChangeTracker(v1.IPv4Protocol, nil),
		epTracker:  changetracker.NewEndpointsChangeTracker(v1.IPv4Protocol, "node-a", nil),
		svcMap:     changetracker.ServicePortMap{},
		epMap:      changetracker.EndpointsMap{},
	}
}

func (f *fakeFamily) addService(name, clusterIP, endpoint string) {
	f.svcTracker.Update(nil, service(name, clusterIP))
	f.epTracker.EndpointSliceUpdate(slice(name, endpoint), false)
}

// addStickyService adds a service with ClientIP affinity, which has
// chains of its own (per-endpoint affinity sets need them).
func (f *fakeFamily) addStickyService(name, clusterIP, endpoint string) {
	svc := service(name, clusterIP)
	svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	f.svcTracker.Update(nil, svc)
	f.epTracker.EndpointSliceUpdate(slice(name, endpoint), false)
}

func (f *fakeFamily) deleteStickyService(name, clusterIP, endpoint string) {
	svc := service(name, clusterIP)
	svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	f.svcTracker.Update(svc, nil)
	f.epTracker.EndpointSliceUpdate(slice(name, endpoint), true)
}

func service(name, clusterIP string) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: v1.ServiceSpec{ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
	}
}

func slice(name, endpoint string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{endpoint}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
}

// sync runs one sync of the backend; it returns whether it was full and
// its error.
func (f *fakeFamily) sync(t *testing.T) (bool, error) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	in := &proxy.FamilyInput{
		Family:          v1.IPv4Protocol,
		Services:        f.svcMap,
		Endpoints:       f.epMap,
		ServiceChanges:  f.svcMap.Update(f.svcTracker),
		EndpointChanges: f.epMap.Update(f.epTracker),
		NodeLabels:      map[string]string{},
		Full:            f.fullNext,
	}
	f.fullNext = false
	outs, err := f.b.Sync(ctx, []*proxy.FamilyInput{in})
	if len(outs) != 1 {
		t.Fatalf("Sync returned %d results, want 1", len(outs))
	}
	return outs[0].Full, err
}

// deleteTable deletes the Fake's table, as nft delete table would.
func (f *fakeFamily) deleteTable(t *testing.T) {
	t.Helper()
	tx := f.fake.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := f.fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
}

// serves reports whether the service-ips map holds clusterIP . tcp . 80.
func (f *fakeFamily) serves(clusterIP string) bool {
	return strings.Contains(f.fake.Dump(), "add element ip kube-proxy service-ips { "+clusterIP+" . tcp . 80 ")
}

// TestSyncAppliesAndRecovers checks that a sync runs the writer's
// transaction; that a transaction the kernel refuses (the table deleted
// under a partial sync) counts a sync failure, and a cleanup failure when
// it was deleting stale chains; and that the sync after a failure is full
// and puts everything back.
func TestSyncAppliesAndRecovers(t *testing.T) {
	f := newFakeFamily(t)
	if full, err := f.sync(t); err != nil || !full {
		t.Fatalf("first sync: full=%v, %v; want a full one that works", full, err)
	}
	if !f.serves("10.96.0.10") {
		t.Fatalf("the first sync did not program ns/web:\n%s", f.fake.Dump())
	}
	f.addStickyService("api", "10.96.0.11", "10.244.0.12")
	if full, err := f.sync(t); err != nil || full {
		t.Fatalf("second sync: full=%v, %v; want a partial one that works", full, err)
	}
	if !f.serves("10.96.0.11") {
		t.Fatalf("the partial sync did not program ns/api:\n%s", f.fake.Dump())
	}
	for _, tc := range []struct {
		name                  string
		change                func()
		wantSync, wantCleanup float64
	}{
		// Adding a service deletes no chain.
		{"add", func() { f.addService("db", "10.96.0.12", "10.244.0.13") }, 1, 0},
		// Deleting one with chains of its own deletes them.
		{"delete", func() { f.deleteStickyService("api", "10.96.0.11", "10.244.0.12") }, 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.deleteTable(t)
			tc.change()
			if full, err := f.sync(t); err == nil || full {
				t.Fatalf("partial sync with the table gone: full=%v, %v; want a partial one that fails", full, err)
			}
			if got := f.m.Value(t, syncFailuresMetric); got != tc.wantSync {
				t.Errorf("sync failures %v, want %v", got, tc.wantSync)
			}
			if got := f.m.Value(t, cleanupFailuresMetric); got != tc.wantCleanup {
				t.Errorf("cleanup failures %v, want %v", got, tc.wantCleanup)
			}
			if full, err := f.sync(t); err != nil || !full {
				t.Fatalf("sync after the failure: full=%v, %v; want a full one that works", full, err)
			}
		})
	}
	for ip, want := range map[string]bool{"10.96.0.10": true, "10.96.0.12": true, "10.96.0.11": false} {
		if got := f.serves(ip); got != want {
			t.Errorf("after recovery, %s served: %v, want %v:\n%s", ip, got, want, f.fake.Dump())
		}
	}
}

// TestRunDetectsDeletedTable checks that Run calls lost once the table is
// gone, and not while it is there, and returns when ctx ends.
func TestRunDetectsDeletedTable(t *testing.T) {
	f := newFakeFamily(t)
	if _, err := f.sync(t); err != nil {
		t.Fatal(err)
	}
	var exists atomic.Bool
	exists.Store(true)
	var checks atomic.Int32
	_, ctx := ktesting.NewTestContext(t)
	b, err := NewMode(ctx, WriterConfig{Family: v1.IPv4Protocol}, f.fake, WithCheckPeriod(time.Millisecond),
		WithTableLookup(func(context.Context) (bool, error) { checks.Add(1); return exists.Load(), nil }))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	lost := make(chan struct{}, 100)
	done := make(chan struct{})
	go func() { b.Run(ctx, func() { lost <- struct{}{} }); close(done) }()
	for checks.Load() < 5 {
		time.Sleep(time.Millisecond)
	}
	select {
	case <-lost:
		t.Fatal("lost called while the table exists")
	default:
	}
	exists.Store(false)
	select {
	case <-lost:
	case <-time.After(10 * time.Second):
		t.Fatal("lost not called after the table went")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after ctx ended")
	}

	// Over the Fake: checkTable says lost exactly when it is gone.
	calls := 0
	f.b.checkTable(ctx, func() { calls++ })
	f.deleteTable(t)
	f.b.checkTable(ctx, func() { calls++ })
	if calls != 1 {
		t.Errorf("lost called %d times for one deletion, want 1", calls)
	}
}

// TestDryRun checks that a dry run prints each family's transaction after
// a header, the first one full, nothing for a sync with nothing to do, and
// that its Run returns at once.
func TestDryRun(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	var out bytes.Buffer
	b, err := NewMode(ctx, WriterConfig{Family: v1.IPv6Protocol, TableName: "proxy-b"}, nil, WithDryRun(&out))
	if err != nil {
		t.Fatal(err)
	}
	in := &proxy.FamilyInput{Family: v1.IPv6Protocol, Services: changetracker.ServicePortMap{}, Endpoints: changetracker.EndpointsMap{}}
	if outs, err := b.Sync(ctx, []*proxy.FamilyInput{in}); err != nil || !outs[0].Full {
		t.Fatalf("first dry-run sync: %v, %+v; want a full one", err, outs)
	}
	want := "# IPv6: nft -f input for table ip6 proxy-b\nadd table ip6 proxy-b"
	if !strings.HasPrefix(out.String(), want) {
		t.Errorf("dry-run output starts %.80q, want %q", out.String(), want)
	}
	out.Reset()
	if _, err := b.Sync(ctx, []*proxy.FamilyInput{in}); err != nil || out.Len() != 0 {
		t.Errorf("second dry-run sync with nothing changed: %v, printed %q; want nothing", err, out.String())
	}
	done := make(chan struct{})
	go func() { b.Run(ctx, func() { t.Error("lost called in a dry run") }); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run of a dry run did not return")
	}
	if err := b.Close(); err != nil {
		t.Errorf("Close of a dry run: %v", err)
	}
}

// TestSyncRefusesOtherInputs checks that a Mode fails a sync given
// another family's input or more than one, and still returns one result
// per input; and that NewMode refuses what the writer refuses.
func TestSyncRefusesOtherInputs(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	b, err := NewMode(ctx, WriterConfig{Family: v1.IPv4Protocol}, nil)
	if err != nil {
		t.Fatal(err)
	}
	v4, v6 := proxytest.Input(v1.IPv4Protocol), proxytest.Input(v1.IPv6Protocol)
	proxytest.SyncRefuses(ctx, t, b, [][]*proxy.FamilyInput{{v6}, {v4, v6}, {}})
	for _, cfg := range []WriterConfig{
		{Family: "IPv5"},
		{Family: v1.IPv4Protocol, TableName: "bad name"},
	} {
		if _, err := NewMode(ctx, cfg, nil); err == nil {
			t.Errorf("New(%+v) succeeded, want an error", cfg)
		}
	}
	// An Interface for another table than cfg's.
	if _, err := NewMode(ctx, WriterConfig{Family: v1.IPv4Protocol, TableName: "other"},
		knftables.NewFake(knftables.IPv4Family, DefaultTableName), WithTableLookup(func(context.Context) (bool, error) { return true, nil })); err == nil {
		t.Error("New with an Interface for another table succeeded")
	}
}

// TestTableLostRepairedInOneSync checks that the full sync after the table
// was found deleted repairs it in one Sync, whose one transaction the
// kernel takes, even when the writer's memory is stale (here, a shared
// chain left unused by a partial sync, which the full sync deletes and
// which went with the table): no sync failure is counted. A second check
// before that sync does not call lost again.
func TestTableLostRepairedInOneSync(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFakeFamily(t)
	two := slice("web", "10.244.0.11")
	two.Endpoints = append(two.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.244.0.12"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	f.epTracker.EndpointSliceUpdate(two, false)
	if full, err := f.sync(t); err != nil || !full {
		t.Fatalf("first sync: full=%v, %v", full, err)
	}
	f.epTracker.EndpointSliceUpdate(slice("web", "10.244.0.11"), false)
	if full, err := f.sync(t); err != nil || full {
		t.Fatalf("partial sync to one endpoint: full=%v, %v", full, err)
	}
	f.deleteTable(t)
	losses := 0
	lost := func() { losses++; f.fullNext = true }
	f.b.checkTable(ctx, lost)
	f.b.checkTable(ctx, lost)
	if losses != 1 {
		t.Errorf("lost called %d times for one deletion, want 1", losses)
	}
	if full, err := f.sync(t); err != nil || !full {
		t.Fatalf("the sync after the loss: full=%v, %v; want a full one that works", full, err)
	}
	if !f.serves("10.96.0.10") {
		t.Errorf("the table was not repaired:\n%s", f.fake.Dump())
	}
	if got := f.m.Value(t, syncFailuresMetric); got != 0 {
		t.Errorf("sync failures %v, want 0", got)
	}
	// The loss is over: a new deletion is a new loss.
	f.deleteTable(t)
	f.b.checkTable(ctx, lost)
	if losses != 2 {
		t.Errorf("lost called %d times after a second deletion, want 2", losses)
	}
}

// countingFake is a Fake that counts the transactions run on it.
type countingFake struct {
	*knftables.Fake
	runs int
}

func (c *countingFake) Run(ctx context.Context, tx *knftables.Transaction) error {
	c.runs++
	return c.Fake.Run(ctx, tx)
}

// TestNetlinkElementSyncs checks that with withNetlinkElementSyncs a
// partial sync of elements alone goes to apply as one batch and not to
// nft, that one with chains (an affinity service) and full syncs go to
// nft, and that a batch apply refuses fails the sync, counts a sync
// failure, and makes the next sync full.
func TestNetlinkElementSyncs(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	fake := &countingFake{Fake: knftables.NewFake(knftables.IPv4Family, DefaultTableName)}
	m := newMetrics()
	var batches int
	var refuse error
	apply := func(b ElementBatch) error {
		batches++
		if refuse != nil {
			return refuse
		}
		// As ApplyElementBatch does in the kernel: one transaction,
		// deletions first.
		tx := fake.NewTransaction()
		b.AddTo(tx)
		return fake.Fake.Run(context.Background(), tx)
	}
	b, err := NewMode(ctx, WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-a"}}, fake,
		WithMetrics(m.Metrics), WithTableLookup(tableExists(fake.Fake)), withNetlinkElementSyncs(apply))
	if err != nil {
		t.Fatal(err)
	}
	f := familyOf(b, fake.Fake, m)
	f.addService("web", "10.96.0.10", "10.244.0.11")
	step := func(what string, change func(), wantFull, wantErr bool, wantRuns, wantBatches int) {
		t.Helper()
		runs, calls := fake.runs, batches
		change()
		full, err := f.sync(t)
		if full != wantFull || (err != nil) != wantErr {
			t.Fatalf("%s: full=%v, error %v; want full=%v, error %v", what, full, err, wantFull, wantErr)
		}
		if fake.runs-runs != wantRuns || batches-calls != wantBatches {
			t.Errorf("%s: %d nft transactions and %d netlink batches, want %d and %d", what, fake.runs-runs, batches-calls, wantRuns, wantBatches)
		}
	}
	step("first sync", func() {}, true, false, 1, 0)
	// ns/web's one endpoint made the shared chains of one endpoint.
	step("service added", func() { f.addService("db", "10.96.0.12", "10.244.0.13") }, false, false, 0, 1)
	if !f.serves("10.96.0.12") {
		t.Fatalf("the batch did not program ns/db:\n%s", f.fake.Dump())
	}
	step("affinity service added", func() { f.addStickyService("api", "10.96.0.11", "10.244.0.12") }, false, false, 1, 0)
	refuse = errors.New("netlink: no such file or directory")
	step("batch refused", func() { f.addService("cache", "10.96.0.13", "10.244.0.14") }, false, true, 0, 1)
	refuse = nil
	if got := m.Value(t, syncFailuresMetric); got != 1 {
		t.Errorf("sync failures %v, want 1", got)
	}
	if f.serves("10.96.0.13") {
		t.Errorf("the refused batch programmed ns/cache")
	}
	step("sync after the refused batch", func() {}, true, false, 1, 0)
	if !f.serves("10.96.0.13") {
		t.Errorf("the full sync did not program ns/cache:\n%s", f.fake.Dump())
	}
}

// TestDryRunPrintsElementSyncs checks that a dry run ignores
// withNetlinkElementSyncs: a partial sync of elements alone is printed as
// nft -f takes it, and nothing is sent.
func TestDryRunPrintsElementSyncs(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	var out bytes.Buffer
	b, err := NewMode(ctx, WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-a"}}, nil, WithDryRun(&out),
		withNetlinkElementSyncs(func(ElementBatch) error { t.Error("a dry run sent a netlink batch"); return nil }))
	if err != nil {
		t.Fatal(err)
	}
	f := familyOf(b, nil, nil)
	f.addService("web", "10.96.0.10", "10.244.0.11")
	if full, err := f.sync(t); err != nil || !full {
		t.Fatalf("first sync: full=%v, %v", full, err)
	}
	out.Reset()
	f.addService("db", "10.96.0.12", "10.244.0.13")
	if full, err := f.sync(t); err != nil || full {
		t.Fatalf("service added: full=%v, %v; want a partial sync", full, err)
	}
	if want := "add element ip kube-proxy service-ips { 10.96.0.12 . tcp . 80 : goto "; !strings.Contains(out.String(), want) {
		t.Errorf("dry run of an element-only partial sync printed:\n%s\nwant a line starting %q", out.String(), want)
	}
}
