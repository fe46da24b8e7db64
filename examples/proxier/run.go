package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/examples/proxier/manifests"
	"github.com/proxykit/proxykit/healthz"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/kernel"
	"github.com/proxykit/proxykit/runner"
)

// manifestSettle folds the several writes of one edit of a manifest file
// into one reload.
const manifestSettle = 100 * time.Millisecond

// run is the proxier. It returns when ctx is done, or after the first sync
// with --dry-run and --once.
func run(ctx context.Context, o *options, env *environment) error {
	if o.cleanup {
		return cleanup(ctx, env, o.names)
	}
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithCancel(ctx)
	// Informers stop when ctx is done; Shutdown then waits for them.
	var shutdown []func()
	defer func() {
		cancel()
		for _, f := range shutdown {
			f()
		}
	}()
	longRunning := !o.dryRun && !o.once
	nodeName, err := o.nodeName()
	if err != nil {
		return err
	}
	client, err := openCluster(ctx, o, env, longRunning)
	if err != nil {
		return err
	}

	// The health of the proxy itself, served on /healthz and /livez.
	var hs *healthz.ProxyHealthServer
	if longRunning && o.healthzBindAddress != "" {
		// kube-proxy's timeout: twice the sync period.
		hs = healthz.NewProxyHealthServer(o.healthzBindAddress, 2*o.syncPeriod, healthz.WithListenFunc(env.listen))
	}

	// This node: its topology labels (for CategorizeEndpoints), its
	// deletion (for /healthz), and its addresses (which IP families to
	// proxy, and the node IPs the rules need).
	var p proxier
	topology := changetracker.NewNodeTopology(nodeName, changetracker.WithNodeLogger(logger),
		changetracker.OnTopologyChange(func(map[string]string) { p.requestSyncAll() }))
	nodeFactory := changetracker.NewNodeInformerFactory(client, nodeName, 0)
	nodeConfig, err := changetracker.NewNodeConfig(ctx, nodeFactory.Core().V1().Nodes(), 0)
	if err != nil {
		return err
	}
	nodeConfig.RegisterEventHandler(topology)
	if hs != nil {
		nodeConfig.RegisterEventHandler(nodeHealth{hs})
	}
	nodeFactory.Start(ctx.Done())
	shutdown = append(shutdown, nodeFactory.Shutdown)
	if !nodeConfig.Run(ctx) {
		return ctx.Err()
	}
	ips, err := findNodeIPs(ctx, nodeFactory.Core().V1().Nodes().Lister().Get, nodeName, env)
	if err != nil {
		return err
	}

	// The backends: one per IP family the node has in iptables mode, one
	// for all of them in IPVS mode; each syncs its families with a runner
	// of its own.
	p.metrics = newMetrics(p.pendingServices, p.pendingEndpoints)
	backends, closeBackends, err := newBackends(ctx, o, env, nodeName, &ips, p.metrics)
	if err != nil {
		return err
	}
	defer closeBackends()
	var svcHealth *serviceHealth
	if longRunning {
		var reporter healthz.HealthReporter
		if hs != nil {
			reporter = hs
		}
		svcHealth = newServiceHealth(healthz.NewServiceHealthServer(nodeName, reporter,
			healthz.WithNodeAddresses(healthCheckAddresses(o, ips)...), healthz.WithListenFunc(env.listen)))
		defer svcHealth.server.Close()
	}
	// In the order of the families, the primary first: a dry run prints
	// in that order.
	var groups []*syncGroup
	var runners []*runner.Runner
	for _, mb := range backends {
		g := &syncGroup{backend: mb.backend}
		var names []string
		for _, family := range mb.families {
			fp := newFamilyProxier(ctx, family, nodeName, topology, p.metrics)
			fp.health, fp.svcHealth = hs, svcHealth
			if !o.dryRun {
				fp.ct = env.conntrack
			}
			g.families = append(g.families, fp)
			names = append(names, string(family))
			p.add(fp)
		}
		r := runner.New("sync-proxy-rules-"+strings.Join(names, "-"), func() error { return g.sync(ctx) },
			o.minSyncPeriod, o.syncPeriod, o.syncPeriod, runner.WithObserver(p.observeSync(mb.families)))
		for _, fp := range g.families {
			fp.requestSync = r.Run
		}
		groups, runners = append(groups, g), append(runners, r)
	}

	// Services and EndpointSlices, through the trackers of every family.
	stopInformers, err := watchServices(ctx, client, &handlers{families: p.all(), metrics: p.metrics})
	shutdown = append(shutdown, stopInformers)
	if err != nil {
		return err
	}

	if !longRunning {
		for _, g := range groups {
			if err := g.sync(ctx); err != nil {
				return err
			}
		}
		return nil
	}

	var wg sync.WaitGroup
	failed := make(chan error, 2)
	for i, g := range groups {
		r := runners[i]
		wg.Go(func() { r.Loop(ctx) })
		wg.Go(func() { g.backend.run(ctx, g.resync) })
	}
	if hs != nil {
		wg.Go(func() {
			if err := hs.Run(ctx); err != nil {
				failed <- fmt.Errorf("health server: %w", err)
			}
		})
	}
	if o.metricsBindAddress != "" {
		if err := serveMetrics(ctx, &wg, env.listen, o.metricsBindAddress, p.metrics, failed); err != nil {
			return err
		}
	}
	logger.Info("Proxier running", "node", nodeName, "families", ips.families, "healthz", o.healthzBindAddress, "metrics", o.metricsBindAddress)
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

// watchServices starts the Service and EndpointSlice informers of client,
// with h as their handler, and returns once both initial lists have been
// delivered to h: a sync from half a cluster would drop the rules of the
// services not listed yet. The returned function waits for the informers
// to stop once ctx is done.
func watchServices(ctx context.Context, client kubernetes.Interface, h *handlers) (func(), error) {
	// Two factories, because kube-proxy selects Services and slices
	// differently (see changetracker.ServiceLabelSelector).
	svcFactory := changetracker.NewServiceInformerFactory(client, 0)
	sliceFactory := changetracker.NewEndpointSliceInformerFactory(client, 0)
	shutdown := func() {
		svcFactory.Shutdown()
		sliceFactory.Shutdown()
	}
	svcConfig, err := changetracker.NewServiceConfig(ctx, svcFactory.Core().V1().Services(), 0)
	if err != nil {
		return func() {}, err
	}
	sliceConfig, err := changetracker.NewEndpointSliceConfig(ctx, sliceFactory.Discovery().V1().EndpointSlices(), 0)
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

// proxier holds the familyProxiers for the parts that see all of them:
// metrics, and topology changes that arrive from the node informer before
// the families exist.
type proxier struct {
	metrics  *metrics
	mu       sync.Mutex
	families []*familyProxier
}

func (p *proxier) add(fp *familyProxier) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.families = append(p.families, fp)
}

func (p *proxier) all() []*familyProxier {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*familyProxier(nil), p.families...)
}

// requestSyncAll asks every family for a sync: the node's labels changed,
// and the writer makes the sync full when they did.
func (p *proxier) requestSyncAll() {
	for _, fp := range p.all() {
		fp.queued()
	}
}

func (p *proxier) pendingServices() int {
	n := 0
	for _, fp := range p.all() {
		n += fp.svcTracker.PendingChanges().Len()
	}
	return n
}

func (p *proxier) pendingEndpoints() int {
	n := 0
	for _, fp := range p.all() {
		n += fp.epTracker.PendingChanges().Len()
	}
	return n
}

// observeSync is the runner's observer for the families it syncs: every
// sync's duration, and the time of the last good one.
func (p *proxier) observeSync(families []v1.IPFamily) func(runner.RunInfo) {
	return func(ri runner.RunInfo) {
		for _, family := range families {
			p.metrics.syncDuration.WithLabelValues(string(family)).Observe(ri.Duration.Seconds())
			if ri.Err == nil {
				p.metrics.lastSync.WithLabelValues(string(family)).Set(float64(ri.Start.Add(ri.Duration).UnixNano()) / 1e9)
			}
		}
	}
}

// openCluster returns the client informers are built on: the fake cluster
// of --manifests (followed for changes when follow is set), or the API
// server of --kubeconfig and --master, or the one the proxier runs in.
func openCluster(ctx context.Context, o *options, env *environment, follow bool) (kubernetes.Interface, error) {
	if env.client != nil {
		return env.client, nil
	}
	logger := klog.FromContext(ctx)
	if o.manifests != "" {
		src, problems, err := manifests.New(ctx, o.manifests)
		for _, pr := range problems {
			logger.Error(pr.Err, "Skipping a manifest document", "file", pr.File, "document", pr.Document)
		}
		if err != nil {
			return nil, err
		}
		if follow {
			if err := src.Watch(ctx, manifestSettle); err != nil {
				return nil, err
			}
		}
		return src.Client(), nil
	}
	cfg, err := apiServerConfig(o, rest.InClusterConfig)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("API server client: %w", err)
	}
	return client, nil
}

// findNodeIPs returns the node's addresses from its Node object or, when
// there is none or it has no addresses, from the host's interfaces.
func findNodeIPs(ctx context.Context, getNode func(string) (*v1.Node, error), nodeName string, env *environment) (nodeIPs, error) {
	logger := klog.FromContext(ctx)
	node, err := getNode(nodeName)
	if err != nil {
		logger.Info("No Node object for this node; taking its addresses from the host's interfaces", "node", nodeName, "err", err)
	}
	addrs := addressesOfNode(logger, node)
	if len(addrs) == 0 {
		if addrs, err = env.hostAddresses(); err != nil {
			return nodeIPs{}, err
		}
	}
	ips := newNodeIPs(addrs)
	if len(ips.families) == 0 {
		return ips, fmt.Errorf("node %s has no addresses: neither its Node object nor the host's interfaces give one", nodeName)
	}
	logger.V(1).Info("Node addresses", "node", nodeName, "addresses", addrs, "families", ips.families)
	return ips, nil
}

// modeBackend is a backend and the IP families it serves, in order.
type modeBackend struct {
	backend  backend
	families []v1.IPFamily
}

// newBackends makes the backends of --mode for the families in ips: one
// per family in iptables mode, one for all of them in IPVS mode. A family
// whose iptables cannot be used here is dropped (and removed from ips)
// unless it is the node's primary one, as kube-proxy falls back to single
// stack. The returned function releases what the backends hold.
func newBackends(ctx context.Context, o *options, env *environment, nodeName string, ips *nodeIPs, m *metrics) ([]modeBackend, func(), error) {
	logger := klog.FromContext(ctx)
	for _, p := range o.clusterCIDRs {
		if _, ok := ips.byFamily[familyOf(p.Addr())]; !ok {
			logger.Info("Ignoring a --cluster-cidr of an IP family the node does not have", "cidr", p)
		}
	}
	if o.mode == modeIPVS {
		return newIPVSBackends(ctx, o, env, nodeName, ips, m)
	}
	var ipts []iptables.Interface
	acceptInvalid := false
	if !o.dryRun {
		var err error
		if ipts, err = familyIPTables(ctx, env, ips); err != nil {
			return nil, nil, err
		}
		acceptInvalid = tuneConntrack(ctx, env.kernel, o.conntrack)
		// A node that ran IPVS mode before keeps its rules, sets, virtual
		// servers and dummy interface until they are removed.
		removeIPVSMode(ctx, env, o.names, ipts)
	}
	var backends []modeBackend
	for i, family := range ips.families {
		cfg := iptables.WriterConfig{
			IPFamily:           family,
			NodeName:           nodeName,
			NodeIPs:            ips.byFamily[family],
			NodePortAddresses:  nodePortPrefixes(o, family, ips.byFamily[family]),
			ClusterCIDR:        o.clusterCIDR(family),
			MasqueradeAll:      o.masqueradeAll,
			MasqueradeBit:      o.masqueradeBit,
			AcceptInvalid:      acceptInvalid,
			LocalhostNodePorts: o.localhostNodePorts,
			ChainPrefix:        o.names.Chains().Prefix(),
		}
		var ipt iptables.Interface
		if ipts != nil {
			ipt = ipts[i]
		}
		b, err := newIPTablesBackend(ctx, cfg, ipt, env.stdout, m, o.syncPeriod, o.driftCheckPeriod)
		if err != nil {
			return nil, nil, err
		}
		// As kube-proxy does at start-up: without the sysctl, connections
		// to a node port on 127.0.0.1 hang (kubernetes#90259).
		if !o.dryRun && b.w.RouteLocalnet() {
			if _, err := env.kernel.EnsureSysctlInt(ctx, kernel.SysctlRouteLocalnet, 1); err != nil {
				return nil, nil, fmt.Errorf("localhost node ports (--iptables-localhost-nodeports): %w", err)
			}
		}
		backends = append(backends, modeBackend{backend: b, families: []v1.IPFamily{family}})
	}
	return backends, func() {}, nil
}

// newIPVSBackends makes IPVS mode's one backend, for every family in ips.
// Unless in a dry run, it refuses with the kernel's reason on a kernel
// that cannot run IPVS mode (after trying to load what is missing), sets
// the sysctls IPVS mode needs, and removes what iptables mode left.
func newIPVSBackends(ctx context.Context, o *options, env *environment, nodeName string, ips *nodeIPs, m *metrics) ([]modeBackend, func(), error) {
	var ipts []iptables.Interface
	var node *ipvsNode
	closeNode := func() {}
	if !o.dryRun {
		if err := env.kernel.CanUseIPVS(ctx, o.ipvsSchedulers()...); err != nil {
			return nil, nil, fmt.Errorf("--mode ipvs: %w", err)
		}
		var err error
		if ipts, err = familyIPTables(ctx, env, ips); err != nil {
			return nil, nil, err
		}
		if node, err = env.openIPVS(ctx, true); err != nil {
			return nil, nil, fmt.Errorf("--mode ipvs: %w", err)
		}
		closeNode = node.close
		if err := tuneIPVS(ctx, env.kernel); err != nil {
			closeNode()
			return nil, nil, err
		}
		tuneConntrack(ctx, env.kernel, o.conntrack)
		removeIPTablesMode(ctx, o.names, ipts)
	}
	var cfgs []ipvs.TranslatorConfig
	for _, family := range ips.families {
		cfgs = append(cfgs, ipvsTranslatorConfig(o, nodeName, family, *ips))
	}
	b, err := newIPVSBackend(cfgs, node, ipts, env.stdout, m)
	if err != nil {
		closeNode()
		return nil, nil, err
	}
	return []modeBackend{{backend: b, families: ips.families}}, closeNode, nil
}

// familyIPTables returns the iptables Interface of each family in ips, of
// the backend (legacy or nft) this node uses. A family other than the
// primary whose iptables does not work is dropped from ips, with a log.
func familyIPTables(ctx context.Context, env *environment, ips *nodeIPs) ([]iptables.Interface, error) {
	logger := klog.FromContext(ctx)
	b, err := env.detectBackend(ctx)
	if err != nil {
		return nil, err
	}
	var ipts []iptables.Interface
	var families []v1.IPFamily
	for i, family := range ips.families {
		ipt, err := usableIPTables(ctx, env, family, b)
		if err != nil && i == 0 {
			return nil, err
		}
		if err != nil {
			logger.Error(err, "Not proxying this IP family", "ipFamily", family)
			continue
		}
		ipts = append(ipts, ipt)
		families = append(families, family)
	}
	ips.families = families
	return ipts, nil
}

func usableIPTables(ctx context.Context, env *environment, family v1.IPFamily, b iptables.Backend) (iptables.Interface, error) {
	proto := iptables.ProtocolIPv4
	if family == v1.IPv6Protocol {
		proto = iptables.ProtocolIPv6
	}
	ipt, err := env.newIPTables(ctx, proto, b)
	if err != nil {
		return nil, fmt.Errorf("%s iptables (%s): %w", family, b, err)
	}
	if err := ipt.Present(ctx); err != nil {
		return nil, fmt.Errorf("%s iptables (%s): %w", family, b, err)
	}
	return ipt, nil
}

// tuneConntrack applies t (nil: the timeouts kube-proxy sets by default,
// which are per network namespace), and reports whether
// nf_conntrack_tcp_be_liberal is on (then out-of-window TCP packets are
// not INVALID, and the rule dropping INVALID packets is left out, as
// kube-proxy does: kubernetes#117924). nf_conntrack_max is left alone
// unless a --config file sets conntrack.maxPerCore: it is host-wide, and
// lowering the host's limit is not an example's call by default.
func tuneConntrack(ctx context.Context, k *kernel.Kernel, t *conntrack.Tuning) bool {
	logger := klog.FromContext(ctx)
	if t == nil {
		t = &conntrack.Tuning{TCPEstablishedTimeout: defaultTCPEstablishedTimeout, TCPCloseWaitTimeout: defaultTCPCloseWaitTimeout}
	}
	err := conntrack.Tune(ctx, k, *t)
	if err != nil {
		logger.Error(err, "Tuning conntrack; going on with the kernel's settings")
	}
	v, err := k.ReadSysctlInt("net/netfilter/nf_conntrack_tcp_be_liberal")
	return err == nil && v == 1
}

// serveMetrics starts the /metrics server; the listener is opened here so
// that a bad or busy address fails the start-up.
func serveMetrics(ctx context.Context, wg *sync.WaitGroup, listen healthz.ListenFunc, addr string, m *metrics, failed chan<- error) error {
	l, err := listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics server: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	wg.Go(func() {
		if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			failed <- fmt.Errorf("metrics server: %w", err)
		}
	})
	wg.Go(func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	})
	return nil
}
