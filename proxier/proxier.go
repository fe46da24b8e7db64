package proxier

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/healthz"
	"github.com/proxykit/proxykit/proxier/config"
	"github.com/proxykit/proxykit/runner"
)

// Proxier is a whole node service proxy around the Backends of a proxy
// mode. Make it with New and run it with Run (or RunOnce), once.
type Proxier struct {
	client      kubernetes.Interface
	nodeName    string
	newBackends NewBackendsFunc
	o           options
	metrics     *metrics
	started     atomic.Bool

	mu       sync.Mutex
	families []*familyProxier
}

// New returns a Proxier for the node named nodeName (as its Node object is
// named), watching the cluster through client, whose proxy mode
// newBackends makes once the node's addresses are known. It registers the
// metrics (WithMetricsRegisterer) and starts nothing.
//
// It fails on a nil client or newBackends, an empty nodeName, sync periods
// that WithSyncPeriods and WithRetryPeriod refuse, or a registerer that
// refuses the metrics.
func New(client kubernetes.Interface, nodeName string, newBackends NewBackendsFunc, opts ...Option) (*Proxier, error) {
	o := defaultOptions()
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	switch {
	case client == nil:
		return nil, errors.New("proxier: no Kubernetes client")
	case nodeName == "":
		return nil, errors.New("proxier: the node name is empty")
	case newBackends == nil:
		return nil, errors.New("proxier: no backend factory")
	case o.maxSyncPeriod <= 0:
		return nil, fmt.Errorf("proxier: sync period %v: must be positive", o.maxSyncPeriod)
	case o.minSyncPeriod < 0 || o.minSyncPeriod > o.maxSyncPeriod:
		return nil, fmt.Errorf("proxier: min sync period %v: must be between 0 and the sync period (%v)", o.minSyncPeriod, o.maxSyncPeriod)
	case o.retrySet && o.retryPeriod <= 0:
		return nil, fmt.Errorf("proxier: retry period %v: must be positive", o.retryPeriod)
	}
	if !o.retrySet || o.retryPeriod > o.maxSyncPeriod {
		o.retryPeriod = o.maxSyncPeriod
	}
	p := &Proxier{client: client, nodeName: nodeName, newBackends: newBackends, o: o}
	m, err := newMetrics(o.registerer, p.pendingServices, p.pendingEndpoints)
	if err != nil {
		return nil, err
	}
	p.metrics = m
	return p, nil
}

// Run runs the proxier until ctx is done, then returns nil, leaving the
// backends' state in place (as kube-proxy does, so that the next proxier
// takes over without a gap). In order, it:
//
//   - watches this node's Node object for its topology labels (a change
//     syncs every family) and its deletion (which fails /healthz), and
//     waits for the first list;
//   - finds the node's addresses and its primary IP family (Node), and
//     makes the backends with them, which decide the families proxied;
//   - gives each family of each BackendGroup a pair of change trackers,
//     and each BackendGroup a runner.Runner, which syncs at most once per
//     min sync period, at least once per sync period, and within the
//     retry period after a failure;
//   - starts the Service and EndpointSlice informers with kube-proxy's
//     selectors, and syncs nothing before both have listed everything;
//   - watches the ServiceCIDR objects (networking.k8s.io/v1) for
//     FamilyInput.ServiceCIDRs, a change of a family's ranges syncing
//     that family, and waits for their first list too, unless listing
//     them fails: an API server before 1.33 does not serve them, and a
//     proxy's RBAC may not allow them (kube-proxy watches them only when
//     its MultiCIDRServiceAllocator gate is on). Then it logs that and
//     goes on without them, the informer trying again in the
//     background, so that the proxy starts all the same;
//   - runs every Backend's Run, the runners, and the health servers.
//
// It returns an error, having stopped what it started, when the backends
// cannot be made or a health server cannot listen; ctx.Err() when ctx ends before the first lists; and an error on
// a second call.
func (p *Proxier) Run(ctx context.Context) error { return p.run(ctx, true) }

// RunOnce does what Run does up to the first lists of Services and
// EndpointSlices, then syncs every backend group once, in order, and
// returns the first sync's error (the groups after it are not synced). It
// opens no health server and calls no Backend's Run: it is for a dry run,
// a one-shot apply, and tests.
func (p *Proxier) RunOnce(ctx context.Context) error { return p.run(ctx, false) }

func (p *Proxier) run(ctx context.Context, longRunning bool) error {
	if !p.started.CompareAndSwap(false, true) {
		return errors.New("proxier: Run or RunOnce called twice")
	}
	logger := klog.FromContext(ctx)
	if p.metrics.clientHooksTaken {
		logger.Error(ErrClientMetricsHooksTaken, "The rest_client_ metrics on the Proxier's registerer stay empty")
	}
	ctx, cancel := context.WithCancel(ctx)
	// Informers stop when ctx is done; Shutdown then waits for them.
	var shutdown []func()
	defer func() {
		cancel()
		for _, f := range shutdown {
			f()
		}
	}()

	// The health of the proxy itself, served on /healthz and /livez.
	var hs *healthz.ProxyHealthServer
	if longRunning && p.o.healthzAddress != "" {
		// kube-proxy's timeout: twice the sync period.
		hs = healthz.NewProxyHealthServer(p.o.healthzAddress, 2*p.o.maxSyncPeriod, healthz.WithListenFunc(p.o.listen),
			healthz.WithProbeCounters(p.metrics.healthzTotal, p.metrics.livezTotal))
	}

	// This node: its topology labels (for CategorizeEndpoints), its
	// deletion (for /healthz), and its addresses (which IP families to
	// proxy, and the node IPs the backends need).
	topology := changetracker.NewNodeTopology(p.nodeName, changetracker.WithLogger(logger),
		changetracker.OnTopologyChange(func(map[string]string) { p.requestSyncAll() }))
	nodeFactory := config.NewNodeInformerFactory(p.client, p.nodeName, 0)
	nodeConfig, err := config.NewNodeConfig(ctx, nodeFactory.Core().V1().Nodes(), 0)
	if err != nil {
		return err
	}
	nodeConfig.RegisterEventHandler(topology)
	for _, h := range p.o.nodeHandlers {
		nodeConfig.RegisterEventHandler(h)
	}
	if hs != nil {
		nodeConfig.RegisterEventHandler(nodeHealth{hs})
	}
	nodeFactory.Start(ctx.Done())
	shutdown = append(shutdown, nodeFactory.Shutdown)
	if !nodeConfig.Run(ctx) {
		return ctx.Err()
	}
	node, err := findNode(ctx, nodeFactory.Core().V1().Nodes().Lister().Get, p.nodeName, p.o.hostAddresses)
	if err != nil {
		return err
	}

	groups, err := p.newBackends(ctx, node, p.metrics.backend)
	for _, g := range groups {
		if c, ok := g.Backend.(io.Closer); ok {
			defer func() {
				if err := c.Close(); err != nil {
					logger.Error(err, "Closing a backend")
				}
			}()
		}
	}
	if err != nil {
		return err
	}
	served, err := checkGroups(node, groups)
	if err != nil {
		return err
	}
	var svcHealth *serviceHealth
	if longRunning && p.o.serviceHealth {
		var reporter healthz.HealthReporter
		if hs != nil {
			reporter = hs
		}
		var addrs []netip.Addr
		if p.o.serviceHealthAddresses != nil {
			addrs = p.o.serviceHealthAddresses(served)
		}
		svcHealth = newServiceHealth(healthz.NewServiceHealthServer(p.nodeName, reporter,
			healthz.WithNodeAddresses(addrs...), healthz.WithListenFunc(p.o.listen)))
		defer svcHealth.server.Close()
	}
	cidrs := newServiceCIDRs(logger, p.requestSyncFamily)
	// In the order of the groups: RunOnce syncs them in that order.
	syncGroups := make([]*syncGroup, len(groups))
	runners := make([]*runner.Runner, len(groups))
	shares := map[v1.IPFamily]*familyShare{}
	runnerNames := map[string]bool{}
	for _, f := range served.Families {
		shares[f] = newFamilyShare(f, hs, p.metrics)
	}
	for i, bg := range groups {
		g := &syncGroup{backend: bg.Backend}
		var names []string
		for _, family := range bg.Families {
			fp := newFamilyProxierWith(ctx, family, p.nodeName, topology, p.metrics, p.o.makeServicePort, p.o.makeEndpoint,
				slices.Concat(node.IPs[v1.IPv4Protocol], node.IPs[v1.IPv6Protocol])...)
			shares[family].join(fp)
			fp.svcHealth, fp.ct = svcHealth, p.o.conntrack
			fp.serviceCIDRs = cidrs
			fp.setNodeIPs(node.IPs[family])
			g.families = append(g.families, fp)
			names = append(names, string(family))
			p.add(fp)
		}
		name := "sync-proxy-rules-" + strings.Join(names, "-")
		if runnerNames[name] {
			// Another group serves the same families: the logs tell
			// the runners apart by the group's index.
			name = fmt.Sprintf("%s-%d", name, i)
		}
		runnerNames[name] = true
		r := runner.New(name, func() error { return g.sync(ctx) },
			p.o.minSyncPeriod, p.o.retryPeriod, p.o.maxSyncPeriod, runner.WithObserver(p.observeSync(g.families)))
		for _, fp := range g.families {
			fp.requestSync = r.Run
		}
		syncGroups[i], runners[i] = g, r
	}

	// The node's addresses as they change: each family's input carries
	// them. Registered once the families exist; the Node read by findNode
	// may be older than the first event, so it is read again.
	addrs := &nodeAddresses{logger: logger, families: p.all()}
	nodeConfig.RegisterEventHandler(addrs)
	var healthAddrs *healthAddresses
	if svcHealth != nil && p.o.serviceHealthAddresses != nil {
		// After addrs, which it reads the addresses from.
		healthAddrs = &healthAddresses{ctx: ctx, server: svcHealth.server,
			addresses: p.o.serviceHealthAddresses, node: served, families: p.all()}
		nodeConfig.RegisterEventHandler(healthAddrs)
	}
	if n, err := nodeFactory.Core().V1().Nodes().Lister().Get(p.nodeName); err == nil {
		addrs.OnNodeUpdate(nil, n)
		if healthAddrs != nil {
			healthAddrs.update()
		}
	}

	// Services and EndpointSlices, through the trackers of every family,
	// and the service CIDRs, listed meanwhile.
	cidrFactory := informers.NewSharedInformerFactory(p.client, 0)
	cidrConfig, err := config.NewServiceCIDRConfig(ctx, cidrFactory.Networking().V1().ServiceCIDRs(), 0)
	if err != nil {
		return err
	}
	cidrConfig.RegisterEventHandler(cidrs)
	cidrFactory.Start(ctx.Done())
	shutdown = append(shutdown, cidrFactory.Shutdown)
	stopInformers, err := watchServices(ctx, p.client, &handlers{families: p.all(), metrics: p.metrics}, p.o.proxyName)
	shutdown = append(shutdown, stopInformers)
	if err != nil {
		return err
	}
	if err := cidrConfig.Run(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		logger.Info("Syncing without service CIDRs until they can be listed: connections to unallocated cluster IPs are not dropped", "err", err)
	}

	if !longRunning {
		for _, g := range syncGroups {
			if err := g.sync(ctx); err != nil {
				return err
			}
		}
		return nil
	}

	var wg sync.WaitGroup
	failed := make(chan error, 1)
	for i, g := range syncGroups {
		r := runners[i]
		wg.Go(func() { r.Loop(ctx) })
		wg.Go(func() { g.backend.Run(ctx, g.resync) })
	}
	if hs != nil {
		wg.Go(func() {
			if err := hs.Run(ctx); err != nil {
				failed <- fmt.Errorf("health server: %w", err)
			}
		})
	}
	logger.Info("Proxier running", "node", p.nodeName, "families", served.Families, "healthz", p.o.healthzAddress)
	select {
	case <-ctx.Done():
		err = nil
	case err = <-failed:
	}
	cancel()
	wg.Wait()
	logger.Info("Proxier stopped; its rules stay in place")
	return err
}

// checkGroups checks that groups serve only families of node (both IP
// families), each group with a Backend and each of its families once, and
// returns node as the groups serve it: only the families they serve, in
// the node's order. Several groups may serve one family.
func checkGroups(node Node, groups []BackendGroup) (Node, error) {
	if len(groups) == 0 {
		return Node{}, errors.New("proxier: the backend factory made no backend")
	}
	seen := map[v1.IPFamily]bool{}
	for i, g := range groups {
		if g.Backend == nil || len(g.Families) == 0 {
			return Node{}, fmt.Errorf("proxier: backend group %d has no backend or no family", i)
		}
		for j, f := range g.Families {
			if !slices.Contains(node.Families, f) {
				return Node{}, fmt.Errorf("proxier: backend group %d serves %q, which is not an IP family of node %s", i, f, node.Name)
			}
			if slices.Contains(g.Families[:j], f) {
				// Its Sync would get two inputs of one family.
				return Node{}, fmt.Errorf("proxier: backend group %d lists %s twice", i, f)
			}
			seen[f] = true
		}
	}
	served := Node{Name: node.Name, IPs: map[v1.IPFamily][]netip.Addr{}}
	for _, f := range node.Families {
		if seen[f] {
			served.Families = append(served.Families, f)
			served.IPs[f] = slices.Clone(node.IPs[f])
		}
	}
	return served, nil
}

// watchServices starts the Service and EndpointSlice informers of client,
// with h as their handler, and returns once both initial lists have been
// delivered to h: a sync from half a cluster would drop the rules of the
// services not listed yet. The returned function waits for the informers
// to stop once ctx is done.
func watchServices(ctx context.Context, client kubernetes.Interface, h *handlers, proxyName string) (func(), error) {
	// Two factories, because kube-proxy selects Services and slices
	// differently (see config.ServiceLabelSelector).
	svcFactory := config.NewServiceInformerFactory(client, 0, config.WithServiceProxyName(proxyName))
	sliceFactory := config.NewEndpointSliceInformerFactory(client, 0)
	shutdown := func() {
		svcFactory.Shutdown()
		sliceFactory.Shutdown()
	}
	svcConfig, err := config.NewServiceConfig(ctx, svcFactory.Core().V1().Services(), 0)
	if err != nil {
		return func() {}, err
	}
	sliceConfig, err := config.NewEndpointSliceConfig(ctx, sliceFactory.Discovery().V1().EndpointSlices(), 0)
	if err != nil {
		return func() {}, err
	}
	svcConfig.RegisterEventHandler(h)
	sliceConfig.RegisterEventHandler(h)
	svcFactory.Start(ctx.Done())
	sliceFactory.Start(ctx.Done())
	if !svcConfig.Run(ctx) || !sliceConfig.Run(ctx) {
		return shutdown, ctx.Err()
	}
	return shutdown, nil
}

func (p *Proxier) add(fp *familyProxier) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.families = append(p.families, fp)
}

func (p *Proxier) all() []*familyProxier {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.families)
}

// requestSyncFamily asks the family for a sync: its service CIDRs
// changed.
func (p *Proxier) requestSyncFamily(family v1.IPFamily) {
	for _, fp := range p.all() {
		if fp.family == family {
			fp.queued()
		}
	}
}

// requestSyncAll asks every family for a sync: the node's labels changed,
// and the backends make the sync full when they did.
func (p *Proxier) requestSyncAll() {
	for _, fp := range p.all() {
		fp.queued()
	}
}

func (p *Proxier) pendingServices() int {
	return p.pending(func(fp *familyProxier) int { return fp.svcTracker.PendingChanges().Len() })
}

func (p *Proxier) pendingEndpoints() int {
	return p.pending(func(fp *familyProxier) int { return fp.epTracker.PendingChanges().Len() })
}

// pending sums, over the families, the count pending gives for the group
// furthest behind in each.
func (p *Proxier) pending(pending func(*familyProxier) int) int {
	shares := map[*familyShare]bool{}
	n := 0
	for _, fp := range p.all() {
		if !shares[fp.share] {
			shares[fp.share] = true
			n += fp.share.pending(pending)
		}
	}
	return n
}

// observeSync is the runner's observer for the families of one group:
// every sync's duration, and the time of the last good one.
func (p *Proxier) observeSync(families []*familyProxier) func(runner.RunInfo) {
	return func(ri runner.RunInfo) {
		for _, fp := range families {
			p.metrics.syncDuration.WithLabelValues(string(fp.family)).Observe(ri.Duration.Seconds())
			if ri.Err == nil {
				fp.share.syncedAt(fp, ri.Start.Add(ri.Duration))
			}
		}
	}
}
