package healthz

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"
)

var t0 = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

const healthTimeout = 30 * time.Second

// stamp formats t0+d as the JSON bodies do.
func stamp(d time.Duration) string { return t0.Add(d).Format(time.RFC3339Nano) }

// get runs a request against h and returns the status and decoded JSON
// body, after checking the headers every response must have.
func get(t *testing.T, h http.Handler, path string) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return decode(t, rec.Result())
}

func decode(t *testing.T, resp *http.Response) (int, map[string]any) {
	t.Helper()
	defer resp.Body.Close()
	for k, want := range map[string]string{"Content-Type": "application/json", "X-Content-Type-Options": "nosniff"} {
		if got := resp.Header.Get(k); got != want {
			t.Errorf("header %s = %q, want %q", k, got, want)
		}
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("body %q is not JSON: %v", body, err)
	}
	return resp.StatusCode, m
}

func taintedNode(key string) *v1.Node {
	return &v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: key, Effect: v1.TaintEffectNoSchedule}}}}
}

func TestProxyHealth(t *testing.T) {
	type step struct {
		at     time.Duration // fake clock time, from t0
		family v1.IPFamily
		queue  bool // QueuedUpdate; else Updated
	}
	for _, tc := range []struct {
		name        string
		steps       []step
		node        *v1.Node
		syncNode    bool
		now         time.Duration
		wantHealthz int
		wantLivez   int
		// wantBody is the /livez body. The /healthz body is the same
		// with nodeEligible added and, when only the node makes it
		// unhealthy, healthy false and lastUpdated the real last sync
		// (healthzLastUpdated) instead of the current time.
		wantBody           map[string]any
		healthzLastUpdated string
	}{{
		name:        "fresh server, nothing queued",
		now:         time.Minute,
		wantHealthz: 200, wantLivez: 200,
		wantBody: map[string]any{"lastUpdated": stamp(time.Minute), "currentTime": stamp(time.Minute), "healthy": true},
	}, {
		name:        "queued, not synced, exactly at the timeout: still healthy",
		steps:       []step{{at: 0, family: v1.IPv4Protocol, queue: true}},
		now:         healthTimeout,
		wantHealthz: 200, wantLivez: 200,
		wantBody: map[string]any{
			"lastUpdated": stamp(healthTimeout), "currentTime": stamp(healthTimeout), "healthy": true,
			"status": map[string]any{"IPv4": map[string]any{"healthy": true}},
		},
	}, {
		name:        "queued and never synced, past the timeout",
		steps:       []step{{at: 0, family: v1.IPv4Protocol, queue: true}},
		now:         healthTimeout + time.Second,
		wantHealthz: 503, wantLivez: 503,
		wantBody: map[string]any{
			"lastUpdated": "0001-01-01T00:00:00Z", "currentTime": stamp(healthTimeout + time.Second), "healthy": false,
			"status": map[string]any{"IPv4": map[string]any{"healthy": false}},
		},
	}, {
		name: "the timeout runs from the oldest queued update",
		steps: []step{
			{at: 0, family: v1.IPv4Protocol},
			{at: 10 * time.Second, family: v1.IPv4Protocol, queue: true},
			{at: 35 * time.Second, family: v1.IPv4Protocol, queue: true},
		},
		now:         41 * time.Second,
		wantHealthz: 503, wantLivez: 503,
		wantBody: map[string]any{
			"lastUpdated": stamp(0), "currentTime": stamp(41 * time.Second), "healthy": false,
			"status": map[string]any{"IPv4": map[string]any{"lastUpdated": stamp(0), "healthy": false}},
		},
	}, {
		name: "a sync clears the queue",
		steps: []step{
			{at: 0, family: v1.IPv4Protocol, queue: true},
			{at: 50 * time.Second, family: v1.IPv4Protocol},
		},
		now:         time.Hour,
		wantHealthz: 200, wantLivez: 200,
		wantBody: map[string]any{
			"lastUpdated": stamp(time.Hour), "currentTime": stamp(time.Hour), "healthy": true,
			"status": map[string]any{"IPv4": map[string]any{"lastUpdated": stamp(50 * time.Second), "healthy": true}},
		},
	}, {
		name: "dual stack: IPv6 stuck makes the proxy unhealthy",
		steps: []step{
			{at: 0, family: v1.IPv4Protocol}, {at: 0, family: v1.IPv6Protocol},
			{at: time.Second, family: v1.IPv4Protocol, queue: true}, {at: time.Second, family: v1.IPv6Protocol, queue: true},
			{at: 2 * time.Second, family: v1.IPv4Protocol},
		},
		now:         time.Minute,
		wantHealthz: 503, wantLivez: 503,
		wantBody: map[string]any{
			"lastUpdated": stamp(2 * time.Second), "currentTime": stamp(time.Minute), "healthy": false,
			"status": map[string]any{
				"IPv4": map[string]any{"lastUpdated": stamp(2 * time.Second), "healthy": true},
				"IPv6": map[string]any{"lastUpdated": stamp(0), "healthy": false},
			},
		},
	}, {
		name:        "node tainted by the autoscaler: /healthz fails, /livez does not",
		steps:       []step{{at: 0, family: v1.IPv4Protocol}},
		node:        taintedNode(ToBeDeletedTaint),
		syncNode:    true,
		now:         time.Second,
		wantHealthz: 503, wantLivez: 200,
		wantBody: map[string]any{
			"lastUpdated": stamp(time.Second), "currentTime": stamp(time.Second), "healthy": true,
			"status": map[string]any{"IPv4": map[string]any{"lastUpdated": stamp(0), "healthy": true}},
		},
		healthzLastUpdated: stamp(0),
	}, {
		name:        "node with other taints is eligible",
		node:        taintedNode("node.kubernetes.io/unschedulable"),
		syncNode:    true,
		wantHealthz: 200, wantLivez: 200,
		wantBody: map[string]any{"lastUpdated": stamp(0), "currentTime": stamp(0), "healthy": true},
	}, {
		name:        "node being deleted",
		node:        &v1.Node{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &metav1.Time{Time: t0}}},
		syncNode:    true,
		wantHealthz: 503, wantLivez: 200,
		wantBody:           map[string]any{"lastUpdated": stamp(0), "currentTime": stamp(0), "healthy": true},
		healthzLastUpdated: "0001-01-01T00:00:00Z",
	}, {
		name:        "node object gone",
		node:        nil,
		syncNode:    true,
		wantHealthz: 503, wantLivez: 200,
		wantBody:           map[string]any{"lastUpdated": stamp(0), "currentTime": stamp(0), "healthy": true},
		healthzLastUpdated: "0001-01-01T00:00:00Z",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakePassiveClock(t0)
			s := NewProxyHealthServer("127.0.0.1:0", healthTimeout, WithClock(clk))
			for _, st := range tc.steps {
				clk.SetTime(t0.Add(st.at))
				if st.queue {
					s.QueuedUpdate(st.family)
				} else {
					s.Updated(st.family)
				}
			}
			if tc.syncNode {
				s.SyncNode(tc.node)
			}
			clk.SetTime(t0.Add(tc.now))

			code, body := get(t, s.Handler(), "/livez")
			if code != tc.wantLivez {
				t.Errorf("/livez status %d, want %d", code, tc.wantLivez)
			}
			if diff := cmp.Diff(tc.wantBody, body); diff != "" {
				t.Errorf("/livez body (-want +got):\n%s", diff)
			}

			wantHealthz := maps.Clone(tc.wantBody)
			wantHealthz["nodeEligible"] = tc.healthzLastUpdated == ""
			if tc.healthzLastUpdated != "" {
				wantHealthz["healthy"] = false
				wantHealthz["lastUpdated"] = tc.healthzLastUpdated
			}
			code, body = get(t, s.Handler(), "/healthz")
			if code != tc.wantHealthz {
				t.Errorf("/healthz status %d, want %d", code, tc.wantHealthz)
			}
			if diff := cmp.Diff(wantHealthz, body); diff != "" {
				t.Errorf("/healthz body (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNodeEligibleRecovers(t *testing.T) {
	s := NewProxyHealthServer("", healthTimeout, WithClock(clocktesting.NewFakePassiveClock(t0)))
	if !s.NodeEligible() {
		t.Fatal("eligible before any SyncNode should be true")
	}
	s.SyncNode(taintedNode(ToBeDeletedTaint))
	if s.NodeEligible() {
		t.Fatal("tainted node is eligible")
	}
	s.SyncNode(&v1.Node{})
	if !s.NodeEligible() {
		t.Fatal("node with the taint removed is not eligible")
	}
	if code, _ := get(t, s.Handler(), "/healthz"); code != 200 {
		t.Errorf("/healthz after recovery: %d", code)
	}
}

func TestProxyHealthUnknownPath(t *testing.T) {
	s := NewProxyHealthServer("", healthTimeout)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("/metrics: %d, want 404", rec.Code)
	}
}

func TestProxyHealthRun(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	mem := newMemNet()
	listening := make(chan struct{})
	listen := func(ctx context.Context, network, addr string) (net.Listener, error) {
		defer close(listening)
		return mem.Listen(ctx, network, addr)
	}
	s := NewProxyHealthServer("10.0.0.1:10256", healthTimeout, WithListenFunc(listen))
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()

	<-listening
	resp, err := mem.Client().Get("http://10.0.0.1:10256/healthz")
	if err != nil {
		t.Fatal(err)
	}
	if code, body := decode(t, resp); code != 200 || body["healthy"] != true {
		t.Errorf("GET /healthz over the listener: %d %v", code, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run after cancel = %v, want nil", err)
	}
	if open := mem.open(); len(open) != 0 {
		t.Errorf("listeners left open after Run returned: %v", open)
	}
}

func TestProxyHealthRunBindError(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	mem := newMemNet()
	mem.fail["10.0.0.1:10256"] = errors.New("address not available")
	s := NewProxyHealthServer("10.0.0.1:10256", healthTimeout, WithListenFunc(mem.Listen))
	err := s.Run(ctx)
	var oe *net.OpError
	if !errors.As(err, &oe) {
		t.Errorf("Run with an unbindable address = %v, want the listen error", err)
	}
}

// TestProxyHealthProbeCounters checks that WithProbeCounters counts each
// answer under its path's vector and its status code, /healthz's node
// eligibility included, and /livez's without it.
func TestProxyHealthProbeCounters(t *testing.T) {
	type counts map[string]map[string]float64 // metric → code → value
	tests := []struct {
		name  string
		setup func(s *ProxyHealthServer, clk *clocktesting.FakePassiveClock)
		paths []string
		want  counts
	}{{
		name:  "healthy",
		paths: []string{"/healthz", "/healthz", "/livez"},
		want:  counts{"test_healthz_total": {"200": 2}, "test_livez_total": {"200": 1}},
	}, {
		name: "sync overdue",
		setup: func(s *ProxyHealthServer, clk *clocktesting.FakePassiveClock) {
			s.QueuedUpdate(v1.IPv4Protocol)
			clk.SetTime(t0.Add(healthTimeout + time.Second))
		},
		paths: []string{"/healthz", "/livez", "/livez"},
		want:  counts{"test_healthz_total": {"503": 1}, "test_livez_total": {"503": 2}},
	}, {
		name: "node being deleted fails /healthz alone",
		setup: func(s *ProxyHealthServer, _ *clocktesting.FakePassiveClock) {
			s.SyncNode(taintedNode(ToBeDeletedTaint))
		},
		paths: []string{"/healthz", "/livez"},
		want:  counts{"test_healthz_total": {"503": 1}, "test_livez_total": {"200": 1}},
	}, {
		name:  "unknown path counts nothing",
		paths: []string{"/metrics"},
		want:  counts{},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			healthzTotal := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_healthz_total", Help: "h"}, []string{"code"})
			livezTotal := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "test_livez_total", Help: "l"}, []string{"code"})
			reg.MustRegister(healthzTotal, livezTotal)
			clk := clocktesting.NewFakePassiveClock(t0)
			s := NewProxyHealthServer("", healthTimeout, WithClock(clk), WithProbeCounters(healthzTotal, livezTotal))
			if tt.setup != nil {
				tt.setup(s, clk)
			}
			for _, path := range tt.paths {
				s.Handler().ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
			}
			families, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			got := counts{}
			for _, f := range families {
				for _, m := range f.GetMetric() {
					labels := map[string]string{}
					for _, l := range m.GetLabel() {
						labels[l.GetName()] = l.GetValue()
					}
					if len(labels) != 1 {
						t.Errorf("%s has labels %v, want code alone", f.GetName(), labels)
					}
					if got[f.GetName()] == nil {
						got[f.GetName()] = map[string]float64{}
					}
					got[f.GetName()][labels["code"]] = m.GetCounter().GetValue()
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("counters (-want +got):\n%s", diff)
			}
		})
	}
}

// TestProxyHealthWithoutProbeCounters checks that a server made without
// the option, or with nil vectors, answers as before.
func TestProxyHealthWithoutProbeCounters(t *testing.T) {
	for _, opts := range [][]Option{nil, {WithProbeCounters(nil, nil)}} {
		s := NewProxyHealthServer("", healthTimeout, opts...)
		for _, path := range []string{"/healthz", "/livez"} {
			if code, _ := get(t, s.Handler(), path); code != http.StatusOK {
				t.Errorf("%s with options %v: %d, want 200", path, opts, code)
			}
		}
	}
}
