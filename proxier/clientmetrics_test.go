package proxier_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/proxykit/proxykit/proxier"
)

// restClientFamilies returns the rest_client_ families of g, by name.
func restClientFamilies(t *testing.T, g prometheus.Gatherer) []string {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "rest_client_") {
			names = append(names, f.GetName())
		}
	}
	return names
}

// TestRegisterClientMetrics makes requests with a real client-go client
// against a test API server and checks that two registerers both count
// them, with kube-proxy's families, labels and buckets, and that neither
// global registry (client_golang's default, component-base's legacy one)
// gets a rest_client_ family.
func TestRegisterClientMetrics(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/api/v1/namespaces/default/services" {
			_, _ = w.Write([]byte(`{"kind":"ServiceList","apiVersion":"v1","metadata":{},"items":[]}`))
			return
		}
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`))
	}))
	defer srv.Close()
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	host := u.Host

	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	for _, reg := range regs {
		if err := proxier.RegisterClientMetrics(reg); err != nil {
			t.Fatal(err)
		}
	}
	// A second registration on one registerer is no error, and counts
	// nothing twice.
	if err := proxier.RegisterClientMetrics(regs[0]); err != nil {
		t.Fatalf("second registration: %v", err)
	}

	client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := client.CoreV1().Services("default").List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Services("default").Get(ctx, "missing", metav1.GetOptions{}); err == nil {
		t.Fatal("Get of a missing Service: no error")
	}

	want := map[string]seenFamily{
		"rest_client_requests_total": {Type: "COUNTER", Series: map[string]float64{
			"code=200,host=" + host + ",method=GET": 1,
			"code=404,host=" + host + ",method=GET": 1,
		}},
		"rest_client_request_duration_seconds": {
			Type: "HISTOGRAM", Series: map[string]float64{"host=" + host + ",verb=GET": 2},
			Bounds: []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60},
		},
		"rest_client_rate_limiter_duration_seconds": {
			Type: "HISTOGRAM", Series: map[string]float64{"host=" + host + ",verb=GET": 2},
			Bounds: []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60},
		},
		"rest_client_response_size_bytes": {
			Type: "HISTOGRAM", Series: map[string]float64{"host=" + host + ",verb=GET": 2},
			Bounds: []float64{64, 256, 512, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216},
		},
	}
	var names []string
	for name := range want {
		names = append(names, name)
	}
	for i, reg := range regs {
		got := gatherFamilies(t, reg, names...)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("registerer %d (-want +got):\n%s", i, diff)
		}
	}

	for name, g := range map[string]prometheus.Gatherer{
		"prometheus.DefaultGatherer":     prometheus.DefaultGatherer,
		"legacyregistry.DefaultGatherer": legacyregistry.DefaultGatherer,
	} {
		if got := restClientFamilies(t, g); len(got) != 0 {
			t.Errorf("%s has %q, want no rest_client_ family", name, got)
		}
	}
}

// TestRegisterClientMetricsRefused checks that a registerer holding a
// metric of one of the names from elsewhere refuses the client metrics,
// and that this is not mistaken for client-go's hooks being taken.
func TestRegisterClientMetricsRefused(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "rest_client_transport_cert_rotation_gc_calls_total", Help: "someone else's"}))
	err := proxier.RegisterClientMetrics(reg)
	if err == nil || errors.Is(err, proxier.ErrClientMetricsHooksTaken) {
		t.Fatalf("got %v, want a registration error", err)
	}
	if err := proxier.RegisterClientMetrics(nil); err == nil {
		t.Error("nil registerer: no error")
	}
}
