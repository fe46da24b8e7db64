package proxier

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"sync"
	"time"
	"weak"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
)

// ErrClientMetricsHooksTaken is wrapped by RegisterClientMetrics' error
// when client-go's metric hooks were installed by another adapter
// (k8s.io/component-base/metrics/prometheus/restclient, imported for its
// side effect, installs its own in an init function): the families are on
// the registerer, but client-go feeds the other adapter, not them.
var ErrClientMetricsHooksTaken = errors.New("client-go's metric hooks belong to another adapter")

// restBuckets are client-go's latency buckets in kube-proxy, 5ms to a
// minute; the DNS resolver's (not served by kube-proxy) stop at 30s.
var restBuckets = []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60}

// sizeBuckets are client-go's request and response size buckets in
// kube-proxy, 64 bytes to 16MiB.
var sizeBuckets = []float64{64, 256, 512, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216}

// rotationBuckets are the buckets of the exec plugin's certificate age at
// rotation: ten minutes to four years.
var rotationBuckets = []float64{600, 1800, 3600, 14400, 86400, 604800, 2592000, 7776000, 15552000, 31104000, 124416000}

// clientMetrics are client-go's metrics on one registerer, under the
// names, labels and buckets kube-proxy serves them with (those of
// component-base's restclient adapter). It is one Collector, so that a
// second registration on the same registerer finds the first.
type clientMetrics struct {
	requestLatency, rateLimiterLatency   *prometheus.HistogramVec
	requestSize, responseSize            *prometheus.HistogramVec
	requestResult, requestRetry          *prometheus.CounterVec
	execCalls                            *prometheus.CounterVec
	certRotation                         prometheus.Histogram
	certTTL                              prometheus.GaugeFunc
	transportEntries                     prometheus.Gauge
	transportCreates, transportCAReloads *prometheus.CounterVec
	transportGCs                         *prometheus.CounterVec
	certRotationGCs                      prometheus.Counter

	mu     sync.Mutex
	expiry *time.Time
}

func newClientMetrics() *clientMetrics {
	histogram := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	c := &clientMetrics{
		requestLatency: histogram("rest_client_request_duration_seconds",
			"How long client-go's requests took, by verb and API server host.", restBuckets, "verb", "host"),
		rateLimiterLatency: histogram("rest_client_rate_limiter_duration_seconds",
			"How long client-go's requests waited for the client-side rate limiter, by verb and host.", restBuckets, "verb", "host"),
		requestSize: histogram("rest_client_request_size_bytes",
			"Sizes of client-go's request bodies, by verb and host.", sizeBuckets, "verb", "host"),
		responseSize: histogram("rest_client_response_size_bytes",
			"Sizes of the API server's response bodies, by verb and host.", sizeBuckets, "verb", "host"),
		requestResult: counter("rest_client_requests_total",
			"client-go's HTTP requests, by status code, method and host.", "code", "method", "host"),
		requestRetry: counter("rest_client_request_retries_total",
			"client-go's retried requests, by status code, verb and host.", "code", "verb", "host"),
		execCalls: counter("rest_client_exec_plugin_call_total",
			"Calls of a credential exec plugin, by exit code and call status.", "code", "call_status"),
		certRotation: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "rest_client_exec_plugin_certificate_rotation_age",
			Help:    "How long a client certificate from a credential exec plugin lived before it was rotated, in seconds.",
			Buckets: rotationBuckets,
		}),
		transportEntries: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "rest_client_transport_cache_entries",
			Help: "Entries in client-go's transport cache.",
		}),
		transportCreates: counter("rest_client_transport_create_calls_total",
			"Requests for a transport from client-go's cache, by result (hit, miss, miss-gc, uncacheable).", "result"),
		transportCAReloads: counter("rest_client_transport_ca_reload_total",
			"Reloads of the API server's CA bundle that client-go tried, by result and reason.", "result", "reason"),
		transportGCs: counter("rest_client_transport_cache_gc_calls_total",
			"Garbage-collection clean-ups of client-go's transport cache entries, by result (deleted, skipped).", "result"),
		certRotationGCs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rest_client_transport_cert_rotation_gc_calls_total",
			Help: "Certificate rotation goroutines of client-go's transports stopped by garbage collection.",
		}),
	}
	c.certTTL = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "rest_client_exec_plugin_ttl_seconds",
		Help: "Seconds until the earliest client certificate from a credential exec plugin expires (negative once it has); +Inf when no plugin provides one.",
	}, c.ttl)
	return c
}

func (c *clientMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		c.requestLatency, c.rateLimiterLatency, c.requestSize, c.responseSize,
		c.requestResult, c.requestRetry, c.execCalls, c.certRotation, c.certTTL,
		c.transportEntries, c.transportCreates, c.transportCAReloads, c.transportGCs,
		c.certRotationGCs,
	}
}

// Describe is part of prometheus.Collector.
func (c *clientMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.collectors() {
		m.Describe(ch)
	}
}

// Collect is part of prometheus.Collector.
func (c *clientMetrics) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.collectors() {
		m.Collect(ch)
	}
}

func (c *clientMetrics) ttl() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.expiry == nil {
		return math.Inf(1)
	}
	return time.Until(*c.expiry).Seconds()
}

// clientHooks is the adapter installed as client-go's metric hooks: it
// forwards each observation to the clientMetrics of every registerer
// RegisterClientMetrics was called with. It holds them weakly, so that a
// registry nothing else keeps (a test's, a stopped proxier's) is dropped
// instead of being fed for the rest of the process.
type clientHooks struct {
	mu    sync.Mutex
	sinks []weak.Pointer[clientMetrics]
}

// hooks is the process's one adapter: client-go takes metric hooks once
// per process (k8s.io/client-go/tools/metrics.Register), so every
// registerer is fed from it.
var (
	hooks        = &clientHooks{}
	installHooks sync.Once
	hooksOurs    bool
)

func (h *clientHooks) add(c *clientMetrics) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sinks = append(h.sinks, weak.Make(c))
}

// each calls f with every live sink, forgetting those collected.
func (h *clientHooks) each(f func(*clientMetrics)) {
	h.mu.Lock()
	live := make([]*clientMetrics, 0, len(h.sinks))
	kept := h.sinks[:0]
	for _, p := range h.sinks {
		if c := p.Value(); c != nil {
			live = append(live, c)
			kept = append(kept, p)
		}
	}
	clear(h.sinks[len(kept):])
	h.sinks = kept
	h.mu.Unlock()
	for _, c := range live {
		f(c)
	}
}

// The adapters of each of client-go's hook interfaces.
type (
	latencyHook struct {
		vec func(*clientMetrics) *prometheus.HistogramVec
	}
	sizeHook struct {
		vec func(*clientMetrics) *prometheus.HistogramVec
	}
	resultHook      struct{}
	retryHook       struct{}
	execCallsHook   struct{}
	rotationHook    struct{}
	expiryHook      struct{}
	cacheHook       struct{}
	createCallsHook struct{}
	caReloadsHook   struct{}
	certGCHook      struct{}
	cacheGCHook     struct{}
)

func (l latencyHook) Observe(_ context.Context, verb string, u url.URL, d time.Duration) {
	hooks.each(func(c *clientMetrics) { l.vec(c).WithLabelValues(verb, u.Host).Observe(d.Seconds()) })
}

func (s sizeHook) Observe(_ context.Context, verb, host string, size float64) {
	hooks.each(func(c *clientMetrics) { s.vec(c).WithLabelValues(verb, host).Observe(size) })
}

func (resultHook) Increment(_ context.Context, code, method, host string) {
	hooks.each(func(c *clientMetrics) { c.requestResult.WithLabelValues(code, method, host).Inc() })
}

func (retryHook) IncrementRetry(_ context.Context, code, verb, host string) {
	hooks.each(func(c *clientMetrics) { c.requestRetry.WithLabelValues(code, verb, host).Inc() })
}

func (execCallsHook) Increment(code int, status string) {
	hooks.each(func(c *clientMetrics) { c.execCalls.WithLabelValues(strconv.Itoa(code), status).Inc() })
}

func (rotationHook) Observe(d time.Duration) {
	hooks.each(func(c *clientMetrics) { c.certRotation.Observe(d.Seconds()) })
}

func (expiryHook) Set(expiry *time.Time) {
	hooks.each(func(c *clientMetrics) {
		c.mu.Lock()
		c.expiry = expiry
		c.mu.Unlock()
	})
}

func (cacheHook) Observe(entries int) {
	hooks.each(func(c *clientMetrics) { c.transportEntries.Set(float64(entries)) })
}

func (createCallsHook) Increment(result string) {
	hooks.each(func(c *clientMetrics) { c.transportCreates.WithLabelValues(result).Inc() })
}

func (caReloadsHook) Increment(result, reason string) {
	hooks.each(func(c *clientMetrics) { c.transportCAReloads.WithLabelValues(result, reason).Inc() })
}

func (certGCHook) Increment() {
	hooks.each(func(c *clientMetrics) { c.certRotationGCs.Inc() })
}

func (cacheGCHook) Increment(result string) {
	hooks.each(func(c *clientMetrics) { c.transportGCs.WithLabelValues(result).Inc() })
}

// install makes hooks client-go's metric hooks, if no adapter is yet, and
// says whether they are ours.
func install() bool {
	installHooks.Do(func() {
		result := resultHook{}
		clientmetrics.Register(clientmetrics.RegisterOpts{
			ClientCertExpiry:             expiryHook{},
			ClientCertRotationAge:        rotationHook{},
			RequestLatency:               latencyHook{vec: func(c *clientMetrics) *prometheus.HistogramVec { return c.requestLatency }},
			RateLimiterLatency:           latencyHook{vec: func(c *clientMetrics) *prometheus.HistogramVec { return c.rateLimiterLatency }},
			RequestSize:                  sizeHook{vec: func(c *clientMetrics) *prometheus.HistogramVec { return c.requestSize }},
			ResponseSize:                 sizeHook{vec: func(c *clientMetrics) *prometheus.HistogramVec { return c.responseSize }},
			RequestResult:                result,
			RequestRetry:                 retryHook{},
			ExecPluginCalls:              execCallsHook{},
			TransportCacheEntries:        cacheHook{},
			TransportCreateCalls:         createCallsHook{},
			TransportCAReloads:           caReloadsHook{},
			TransportCertRotationGCCalls: certGCHook{},
			TransportCacheGCCalls:        cacheGCHook{},
		})
		// Register does nothing when an adapter came first: ours is in
		// place exactly when client-go's hook is the value just given.
		_, hooksOurs = clientmetrics.RequestResult.(resultHook)
	})
	return hooksOurs
}

// RegisterClientMetrics registers client-go's request metrics on reg under
// the names, labels and buckets kube-proxy serves them with
// (rest_client_requests_total by code, method and host;
// rest_client_request_duration_seconds by verb and host; and the other
// rest_client_ families of k8s.io/component-base's restclient adapter),
// without touching a global registry. A Proxier made with
// WithMetricsRegisterer calls it; call it yourself, before building the
// client, to count the transport that client-go makes then.
//
// client-go takes its metric hooks once per process. The first call
// installs one adapter as those hooks, and every call adds reg to what it
// feeds: each request of any client in the process is counted on every
// registerer given here, so two Proxiers in one process (each with its
// registerer) both count the requests of both. A second call with the same
// reg does nothing. A registerer stays fed as long as its collectors are
// reachable (registered on a registry something keeps). Observations made
// before a registerer was added are not on it.
//
// It fails when reg refuses the metrics (it has one of those names from
// elsewhere); and with an error wrapping ErrClientMetricsHooksTaken, the
// families registered but never fed, when another adapter holds client-go's
// hooks.
func RegisterClientMetrics(reg prometheus.Registerer) error {
	if reg == nil {
		return errors.New("proxier: client metrics: no registerer")
	}
	c := newClientMetrics()
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if _, ok := are.ExistingCollector.(*clientMetrics); ok {
				return nil
			}
		}
		return fmt.Errorf("proxier: registering client-go's metrics: %w", err)
	}
	if !install() {
		return fmt.Errorf("proxier: client metrics: %w", ErrClientMetricsHooksTaken)
	}
	hooks.add(c)
	return nil
}
