package proxier_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxy"
)

// seenFamily is what a test reads of a metric family: its type, and per
// series its labels with the series' count (a counter's or a gauge's
// value, a histogram's sample count) and a histogram's bucket bounds.
type seenFamily struct {
	Type   string             // COUNTER, GAUGE, HISTOGRAM
	Series map[string]float64 // "name=value,..." → count
	Bounds []float64
}

func gatherFamilies(t *testing.T, reg *prometheus.Registry, names ...string) map[string]seenFamily {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]seenFamily{}
	for _, f := range families {
		if !slices.Contains(names, f.GetName()) {
			continue
		}
		sf := seenFamily{Type: f.GetType().String(), Series: map[string]float64{}}
		for _, m := range f.GetMetric() {
			key := ""
			for i, l := range m.GetLabel() {
				if i > 0 {
					key += ","
				}
				key += l.GetName() + "=" + l.GetValue()
			}
			switch {
			case m.GetHistogram() != nil:
				sf.Series[key] = float64(m.GetHistogram().GetSampleCount())
				sf.Bounds = nil
				for _, b := range m.GetHistogram().GetBucket() {
					sf.Bounds = append(sf.Bounds, b.GetUpperBound())
				}
			case m.GetCounter() != nil:
				sf.Series[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sf.Series[key] = m.GetGauge().GetValue()
			}
		}
		got[f.GetName()] = sf
	}
	return got
}

// TestProxierKubeProxyMetrics checks kube-proxy's metric families that the
// proxier feeds from its health server and its conntrack cleanup: after a
// sync with a cleanup and one GET of /healthz and of /livez, each is on the
// caller's registerer with kube-proxy's name, type, labels and buckets.
func TestProxierKubeProxyMetrics(t *testing.T) {
	// kube-proxy's conntrack reconciler buckets: 1ms doubling 15 times.
	ctBuckets := []float64{0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096, 8.192, 16.384}
	want := map[string]seenFamily{
		"kubeproxy_proxy_healthz_total": {Type: "COUNTER", Series: map[string]float64{"code=200": 1}},
		"kubeproxy_proxy_livez_total":   {Type: "COUNTER", Series: map[string]float64{"code=200": 1}},
		"kubeproxy_conntrack_reconciler_sync_duration_seconds": {
			Type: "HISTOGRAM", Series: map[string]float64{"ip_family=IPv4": 1}, Bounds: ctBuckets,
		},
	}
	var names []string
	for name := range want {
		names = append(names, name)
	}

	client := fake.NewClientset(testNode("192.168.0.1"), testService("web", 80, "10.96.0.10"))
	listen, listening := listenLoopback()
	reg := prometheus.NewRegistry()
	b := newRecordingBackend()
	startProxier(t, client, func(_ context.Context, n proxier.Node, _ *proxy.Metrics) ([]proxier.BackendGroup, error) {
		// The primary family alone, as on a host without IPv6.
		return []proxier.BackendGroup{{Backend: b, Families: n.Families[:1]}}, nil
	}, proxier.WithSyncPeriods(0, time.Hour), proxier.WithProxyHealthServer("127.0.0.1:10256"), proxier.WithListenFunc(listen),
		proxier.WithConntrack(&recordingCleaner{}), proxier.WithMetricsRegisterer(reg))
	addr := <-listening
	// The first sync is full, so it cleans conntrack; wait for that.
	eventually(t, "the first sync's conntrack cleanup", func() error {
		got := gatherFamilies(t, reg, "kubeproxy_conntrack_reconciler_sync_duration_seconds")
		if n := got["kubeproxy_conntrack_reconciler_sync_duration_seconds"].Series["ip_family=IPv4"]; n < 1 {
			return fmt.Errorf("%v cleanups timed", n)
		}
		return nil
	})
	for _, path := range []string{"/healthz", "/livez"} {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d, want 200", path, resp.StatusCode)
		}
	}
	if diff := cmp.Diff(want, gatherFamilies(t, reg, names...)); diff != "" {
		t.Errorf("metric families (-want +got):\n%s", diff)
	}
}

// listenLoopback returns a listen function for proxier.WithListenFunc that
// opens its listener on a free loopback port, whatever address it is
// asked for, and sends that listener's address on the channel.
func listenLoopback() (func(ctx context.Context, network, address string) (net.Listener, error), <-chan string) {
	listening := make(chan string, 1)
	return func(ctx context.Context, network, _ string) (net.Listener, error) {
		var lc net.ListenConfig
		l, err := lc.Listen(ctx, network, "127.0.0.1:0")
		if err == nil {
			listening <- l.Addr().String()
		}
		return l, err
	}, listening
}
