package healthz

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// ToBeDeletedTaint is the taint the cluster autoscaler puts on a node it is
// about to delete. A node with it is not eligible: /healthz fails so that
// load balancers stop sending new connections before the node goes.
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// FamilyHealth is the health of the proxier of one IP family.
type FamilyHealth struct {
	// LastUpdated is when that proxier last finished a sync (zero if it
	// never did).
	LastUpdated time.Time `json:"lastUpdated,omitzero"`
	// Healthy is false when an update has been queued for longer than the
	// health timeout without a sync.
	Healthy bool `json:"healthy"`
}

// ProxyHealth is the proxy's health as /healthz and /livez report it in
// their JSON bodies.
type ProxyHealth struct {
	// LastUpdated is the latest sync of any family. In HTTP responses of a
	// healthy proxy it is the current time instead, as kube-proxy reports
	// it, so that old clients that compare it with the clock keep working.
	LastUpdated time.Time `json:"lastUpdated"`
	// CurrentTime is when the health was computed.
	CurrentTime time.Time `json:"currentTime"`
	// NodeEligible is set in /healthz responses only: false while the node
	// is being deleted or is tainted ToBeDeletedByClusterAutoscaler.
	NodeEligible *bool `json:"nodeEligible,omitempty"`
	// Healthy is true when every family is healthy (and, for /healthz, the
	// node is eligible).
	Healthy bool `json:"healthy"`
	// Status is the health per IP family, for the families that have
	// queued or finished an update.
	Status map[v1.IPFamily]FamilyHealth `json:"status,omitempty"`
}

// ProxyHealthServer tracks whether a proxy keeps its rules up to date, per
// IP family, and serves that on /healthz and /livez. Its methods are safe
// for concurrent use.
type ProxyHealthServer struct {
	addr          string
	healthTimeout time.Duration
	clock         clock.PassiveClock
	listen        ListenFunc
	// healthzTotal and livezTotal count the answers; nil counts nothing.
	healthzTotal, livezTotal *prometheus.CounterVec

	mu           sync.RWMutex
	lastUpdated  map[v1.IPFamily]time.Time
	oldestQueued map[v1.IPFamily]time.Time
	nodeEligible bool
}

// NewProxyHealthServer returns a server that will listen on addr
// ("host:port") when [ProxyHealthServer.Run] is called. The proxy is
// unhealthy when a family has had an update queued for longer than
// healthTimeout without a sync; kube-proxy uses twice its sync period. The
// node counts as eligible until [ProxyHealthServer.SyncNode] says
// otherwise. Options: [WithClock], [WithListenFunc], [WithProbeCounters].
func NewProxyHealthServer(addr string, healthTimeout time.Duration, opts ...Option) *ProxyHealthServer {
	o := newOptions(opts)
	return &ProxyHealthServer{
		addr:          addr,
		healthTimeout: healthTimeout,
		clock:         o.clock,
		listen:        o.listen,
		healthzTotal:  o.healthzTotal,
		livezTotal:    o.livezTotal,
		lastUpdated:   map[v1.IPFamily]time.Time{},
		oldestQueued:  map[v1.IPFamily]time.Time{},
		nodeEligible:  true,
	}
}

// QueuedUpdate records that the proxier of family has received a change it
// has not applied yet. Only the first call since the last
// [ProxyHealthServer.Updated] counts: the timeout runs from the oldest
// pending change.
func (s *ProxyHealthServer) QueuedUpdate(family v1.IPFamily) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, pending := s.oldestQueued[family]; !pending {
		s.oldestQueued[family] = s.clock.Now()
	}
}

// Updated records that the proxier of family has finished a sync that
// applied every change queued so far, which makes it healthy.
func (s *ProxyHealthServer) Updated(family v1.IPFamily) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.oldestQueued, family)
	s.lastUpdated[family] = s.clock.Now()
}

// SyncNode records the current state of this node's Node object, from the
// proxier's node informer. The node is eligible unless it has a deletion
// timestamp or the ToBeDeletedByClusterAutoscaler taint; a nil node means
// the object is gone, which makes it ineligible.
func (s *ProxyHealthServer) SyncNode(node *v1.Node) {
	eligible := node != nil && node.DeletionTimestamp == nil
	if eligible {
		for _, taint := range node.Spec.Taints {
			if taint.Key == ToBeDeletedTaint {
				eligible = false
				break
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodeEligible = eligible
}

// NodeEligible reports what the last [ProxyHealthServer.SyncNode] said,
// true if it was never called.
func (s *ProxyHealthServer) NodeEligible() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.nodeEligible
}

// Health returns the proxy's health now, without node eligibility (which
// only /healthz adds). A family is unhealthy when its oldest pending update
// was queued more than the health timeout ago, whether or not it ever
// synced; with no family known yet, the proxy is healthy.
func (s *ProxyHealthServer) Health() ProxyHealth {
	s.mu.RLock()
	defer s.mu.RUnlock()
	now := s.clock.Now()
	h := ProxyHealth{CurrentTime: now, Healthy: true, Status: map[v1.IPFamily]FamilyHealth{}}
	families := maps.Clone(s.lastUpdated)
	for family := range s.oldestQueued {
		families[family] = s.lastUpdated[family]
	}
	for family, last := range families {
		if last.After(h.LastUpdated) {
			h.LastUpdated = last
		}
		fh := FamilyHealth{LastUpdated: last, Healthy: true}
		if queued, pending := s.oldestQueued[family]; pending && now.Sub(queued) > s.healthTimeout {
			fh.Healthy = false
			h.Healthy = false
		}
		h.Status[family] = fh
	}
	return h
}

// Handler returns the HTTP handler of /healthz and /livez, for tests or to
// mount on a server of one's own. Both answer 200 when healthy and 503
// otherwise, with a JSON [ProxyHealth] body; /healthz also requires the
// node to be eligible and reports nodeEligible.
func (s *ProxyHealthServer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { s.serve(w, true) })
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { s.serve(w, false) })
	return mux
}

func (s *ProxyHealthServer) serve(w http.ResponseWriter, withNode bool) {
	h := s.Health()
	if withNode {
		eligible := s.NodeEligible()
		h.NodeEligible = &eligible
		h.Healthy = h.Healthy && eligible
	}
	status := http.StatusServiceUnavailable
	if h.Healthy {
		status = http.StatusOK
		h.LastUpdated = h.CurrentTime
	}
	counter := s.livezTotal
	if withNode {
		counter = s.healthzTotal
	}
	if counter != nil {
		counter.WithLabelValues(strconv.Itoa(status)).Inc()
	}
	writeJSON(w, status, h)
}

// writeJSON writes v as the JSON body of a response with the given status
// and the headers both servers send.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		// Only unsupported types fail to marshal; ours are all plain.
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// Run listens on the server's address and serves /healthz and /livez
// until ctx is done, then closes the listener and returns nil. It returns
// an error if the address cannot be bound or serving fails.
func (s *ProxyHealthServer) Run(ctx context.Context) error {
	ln, err := s.listen(ctx, "tcp", s.addr)
	if err != nil {
		return fmt.Errorf("proxy health server on %s: %w", s.addr, err)
	}
	klog.FromContext(ctx).V(2).Info("Serving proxy health", "address", ln.Addr().String())
	srv := newHTTPServer(s.Handler())
	stop := context.AfterFunc(ctx, func() { _ = srv.Close() })
	defer stop()
	err = srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) && ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("proxy health server on %s: %w", s.addr, err)
}

// newHTTPServer returns a server for handler with timeouts that keep a
// slow or stuck client from holding a connection open for long.
func newHTTPServer(handler http.Handler) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       60 * time.Second,
	}
}
