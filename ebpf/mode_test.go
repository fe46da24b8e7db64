package ebpf_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/ebpf/ebpftest"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/proxy"
	"github.com/proxykit/proxykit/proxy/proxytest"
)

func newMode(t testing.TB, family v1.IPFamily, node proxy.NodeConfig, opts ...ebpf.ModeOption) (*ebpf.Mode, *ebpftest.Fake) {
	t.Helper()
	fk := ebpftest.NewFake(family, ebpf.Sizes{})
	b, err := ebpf.NewMode(context.Background(), ebpf.WriterConfig{Family: family, Node: node}, fk, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b, fk
}

func TestModeConformance(t *testing.T) {
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		t.Run(string(family), proxytest.Suite{
			Families: []v1.IPFamily{family},
			New: func(t testing.TB, node proxy.NodeConfig) (proxy.Backend, proxytest.Datapath) {
				b, fk := newMode(t, family, node)
				return b, proxytest.Datapath{
					Dump:          func() string { return ebpftest.Routes(fk.State()) },
					FailNextApply: func() { fk.FailNext = errors.New("injected failure") },
					Wipe:          func() { *fk.State() = *ebpf.NewState() },
				}
			},
		}.Run)
	}
}

// TestModeRefusesInputs checks that a Mode takes one input of its own
// family and nothing else.
func TestModeRefusesInputs(t *testing.T) {
	b, _ := newMode(t, v1.IPv4Protocol, proxy.NodeConfig{})
	proxytest.SyncRefuses(context.Background(), t, b, [][]*proxy.FamilyInput{
		{proxytest.Input(v1.IPv6Protocol)},
		{proxytest.Input(v1.IPv4Protocol), proxytest.Input(v1.IPv6Protocol)},
		nil,
	})
}

// TestModeDriftCheck checks that a drift check calls lost once for a
// change behind the writer's back, that the sync after it repairs the
// change and counts it, and that a check of untouched maps calls nothing.
func TestModeDriftCheck(t *testing.T) {
	m := proxy.NewMetrics(prometheus.NewRegistry())
	b, fk := newMode(t, v1.IPv4Protocol, proxy.NodeConfig{Name: writertest.Node}, ebpf.WithMetrics(m))
	c := oneService()
	ctx := context.Background()
	sync := func(full bool) {
		t.Helper()
		in := familyInput(c)
		in.Full = full
		if _, err := b.Sync(ctx, []*proxy.FamilyInput{in}); err != nil {
			t.Fatalf("Sync: %v", err)
		}
	}
	sync(true)
	want := ebpftest.Routes(fk.State())
	lost := 0
	b.CheckDrift(ctx, func() { lost++ })
	if lost != 0 {
		t.Fatalf("check of untouched maps called lost %d times", lost)
	}
	fk.State().Services[ebpf.Frontend{Addr: netip.MustParseAddr("10.96.9.9"), Port: 1, Protocol: v1.ProtocolTCP}] = ebpf.Service{ID: 99}
	b.CheckDrift(ctx, func() { lost++ })
	b.CheckDrift(ctx, func() { lost++ })
	if lost != 1 {
		t.Fatalf("two checks of changed maps called lost %d times, want once", lost)
	}
	// lost makes the composition's next inputs Full.
	sync(true)
	if diff := cmp.Diff(want, ebpftest.Routes(fk.State())); diff != "" {
		t.Errorf("routes after repair (-want +got):\n%s", diff)
	}
	if got := counterValue(t, mustCounter(t, m, "kubeproxy_sync_proxy_rules_ebpf_drifted_elements_total").WithLabelValues("IPv4")); got != 1 {
		t.Errorf("drifted elements counted %v, want 1", got)
	}
	// After the repair, a new change is reported again.
	delete(fk.State().Services, ebpf.Frontend{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Protocol: v1.ProtocolTCP})
	b.CheckDrift(ctx, func() { lost++ })
	if lost != 2 {
		t.Errorf("check after a repair and a new change: lost called %d times in all, want 2", lost)
	}
}

// TestModeSyncFailure checks that a failed write fails the sync, counts
// it, and that the next sync repairs what it left.
func TestModeSyncFailure(t *testing.T) {
	m := proxy.NewMetrics(prometheus.NewRegistry())
	b, fk := newMode(t, v1.IPv4Protocol, proxy.NodeConfig{Name: writertest.Node}, ebpf.WithMetrics(m))
	c := oneService()
	ctx := context.Background()
	fk.FailNext = errors.New("injected failure")
	outs, err := b.Sync(ctx, []*proxy.FamilyInput{familyInput(c)})
	if err == nil || len(outs) != 1 {
		t.Fatalf("Sync with a failing write = %d results, %v; want 1 and an error", len(outs), err)
	}
	outs, err = b.Sync(ctx, []*proxy.FamilyInput{familyInput(c)})
	if err != nil || !outs[0].Full {
		t.Fatalf("Sync after a failure = %+v, %v; want a full sync without error", outs, err)
	}
	if diff := cmp.Diff([]string{"-> 10.0.1.1:8080 (p=0.5)", "-> 10.0.1.2:8080 (p=0.5)"}, trace(fk, "10.96.0.1:80", v1.ProtocolTCP)); diff != "" {
		t.Errorf("trace after the repair (-want +got):\n%s", diff)
	}
	if got := counterValue(t, mustCounter(t, m, "kubeproxy_sync_proxy_rules_ebpf_sync_failures_total").WithLabelValues("IPv4")); got != 1 {
		t.Errorf("sync failures counted %v, want 1", got)
	}
}

// oneService is a cluster of one Service, 10.96.0.1:80/TCP, with two
// endpoints.
func oneService() *writertest.Cluster {
	c := writertest.NewCluster(v1.IPv4Protocol, writertest.Node)
	c.SetService(writertest.Service("ns", "a", "10.96.0.1"))
	c.SetEndpoints("ns", "a", writertest.TCP8080, endpoints(2)...)
	return c
}

// familyInput is c's input, with its family set as the proxier sets it.
func familyInput(c *writertest.Cluster) *proxy.FamilyInput {
	in := c.Input()
	in.Family = v1.IPv4Protocol
	return in
}

// counterValue reads c.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// mustCounter returns the counter vector registered under name.
func mustCounter(t *testing.T, m *proxy.Metrics, name string) *prometheus.CounterVec {
	t.Helper()
	const prefix = "kubeproxy_"
	v, err := m.CounterVec(prometheus.CounterOpts{Subsystem: proxy.MetricsSubsystem, Name: name[len(prefix):]}, []string{"ip_family"})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestModeClose checks that Close closes Maps that can be closed.
func TestModeClose(t *testing.T) {
	cm := &closingMaps{Fake: ebpftest.NewFake(v1.IPv4Protocol, ebpf.Sizes{})}
	b, err := ebpf.NewMode(context.Background(), ebpf.WriterConfig{Family: v1.IPv4Protocol}, cm)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil || cm.closed != 1 {
		t.Errorf("Close() = %v and closed the maps %d times, want nil and once", err, cm.closed)
	}
}

type closingMaps struct {
	*ebpftest.Fake
	closed int
}

func (c *closingMaps) Close() error { c.closed++; return nil }
