package proxier

import (
	"context"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/healthz"
	"github.com/proxykit/proxykit/proxier/config"
	"github.com/proxykit/proxykit/proxy"
)

// Option configures a Proxier; see New.
type Option func(*options)

type options struct {
	minSyncPeriod, maxSyncPeriod, retryPeriod time.Duration
	retrySet                                  bool
	conntrack                                 ConntrackCleaner
	healthzAddress                            string
	serviceHealth                             bool
	serviceHealthAddresses                    func(Node) []netip.Addr
	listen                                    healthz.ListenFunc
	registerer                                prometheus.Registerer
	proxyName                                 string
	hostAddresses                             func() ([]netip.Addr, error)
	makeServicePort                           changetracker.MakeServicePortFunc
	makeEndpoint                              changetracker.MakeEndpointFunc
	nodeHandlers                              []config.NodeHandler
}

func defaultOptions() options {
	return options{
		minSyncPeriod: proxy.DefaultMinSyncPeriod,
		maxSyncPeriod: proxy.DefaultSyncPeriod,
		hostAddresses: HostAddresses,
	}
}

// WithSyncPeriods sets the shortest time between the end of one sync of a
// backend group and the start of the next (min; 0 syncs as soon as asked),
// and the longest time between syncs when nothing asks for one (max),
// kube-proxy's --min-sync-period and --sync-period. Defaults:
// proxy.DefaultMinSyncPeriod and proxy.DefaultSyncPeriod. New fails unless
// 0 <= min <= max and max > 0.
func WithSyncPeriods(min, max time.Duration) Option {
	return func(o *options) { o.minSyncPeriod, o.maxSyncPeriod = min, max }
}

// WithRetryPeriod sets how soon a sync that failed is tried again, capped
// at the max sync period; the default is the max sync period, as in
// kube-proxy. New fails on a period that is not positive.
func WithRetryPeriod(d time.Duration) Option {
	return func(o *options) { o.retryPeriod, o.retrySet = d, true }
}

// ConntrackCleaner removes the conntrack entries that a sync made stale:
// those of UDP (and SCTP) flows to a service address whose reply source
// is no longer a serving endpoint, and those to the cluster IPs in
// deletedClusterIPs, whose UDP service ports were deleted. It returns how
// many it deleted; after an error the Proxier calls it again after the
// next good sync, with the deleted cluster IPs of both. The maps are the
// Proxier's and read-only. Package conntrack's Cleaner is one:
//
//	proxier.WithConntrack(conntrack.NewCleaner(conntrack.New()))
//
// which this package leaves to the caller so that importing it does not
// compile netlink.
type ConntrackCleaner interface {
	CleanStaleEntries(ctx context.Context, family v1.IPFamily, services changetracker.ServicePortMap,
		endpoints changetracker.EndpointsMap, deletedClusterIPs sets.Set[netip.Addr]) (int, error)
}

// ConntrackCleanerFunc is a ConntrackCleaner made of a function.
type ConntrackCleanerFunc func(ctx context.Context, family v1.IPFamily, services changetracker.ServicePortMap,
	endpoints changetracker.EndpointsMap, deletedClusterIPs sets.Set[netip.Addr]) (int, error)

// CleanStaleEntries calls f.
func (f ConntrackCleanerFunc) CleanStaleEntries(ctx context.Context, family v1.IPFamily, services changetracker.ServicePortMap,
	endpoints changetracker.EndpointsMap, deletedClusterIPs sets.Set[netip.Addr]) (int, error) {
	return f(ctx, family, services, endpoints, deletedClusterIPs)
}

// WithConntrack makes every good sync of a family clean the conntrack
// entries it made stale, through c (a full sync cleans all of them,
// catching flows from before a restart). Without it (or with a nil c)
// conntrack is left alone, which leaves UDP clients of a removed endpoint
// sending into the void until their flows expire.
func WithConntrack(c ConntrackCleaner) Option {
	return func(o *options) { o.conntrack = c }
}

// WithProxyHealthServer makes Run serve kube-proxy's /healthz and /livez on
// address ("host:port"): unhealthy when a family has had a change queued
// for longer than twice the max sync period without a sync, and /healthz
// also while this node's Node object is being deleted. An empty address
// serves nothing, as does RunOnce. A listener that cannot be opened stops
// Run with the error.
func WithProxyHealthServer(address string) Option {
	return func(o *options) { o.healthzAddress = address }
}

// WithServiceHealthServer makes Run serve the health-check node port of
// every Service with externalTrafficPolicy Local, answering whether this
// node has a ready endpoint of it, as kube-proxy does. addresses, called
// with the node as the backends serve it, gives the addresses to listen
// on; nil (or a function returning none) means every address. It is
// called again, with the new addresses, whenever the Node object's
// addresses change (see FamilyInput.NodeIPs), and the listeners move to
// what it then returns without a restart: those on addresses it still
// gives keep serving. A port that cannot be opened is logged and tried
// again at the next sync. RunOnce serves nothing.
func WithServiceHealthServer(addresses func(Node) []netip.Addr) Option {
	return func(o *options) { o.serviceHealth, o.serviceHealthAddresses = true, addresses }
}

// WithListenFunc makes the health servers open their listeners with f
// instead of net.ListenConfig.Listen. A nil f is ignored.
func WithListenFunc(f healthz.ListenFunc) Option {
	return func(o *options) {
		if f != nil {
			o.listen = f
		}
	}
}

// WithMetricsRegisterer registers the Proxier's metrics under kube-proxy's
// names on reg, client-go's request metrics (RegisterClientMetrics, whose
// hooks are the process's), and its backends' where their NewBackendsFunc
// registers them (the proxy.Metrics it is given). Without it (or with a nil reg)
// they are kept but registered nowhere. New fails if reg already has a
// metric of one of the Proxier's names, as it has when another Proxier
// registered there, and Run fails if it refuses a backend's; the Proxier
// never unregisters them.
func WithMetricsRegisterer(reg prometheus.Registerer) Option {
	return func(o *options) { o.registerer = reg }
}

// WithServiceProxyName makes the Proxier serve only the Services labelled
// service.kubernetes.io/service-proxy-name=name, for a proxy that runs
// beside kube-proxy and takes the Services kube-proxy must leave alone.
// The default (and an empty name) serves the Services without the label.
func WithServiceProxyName(name string) Option {
	return func(o *options) { o.proxyName = name }
}

// WithHostAddresses sets how the node's addresses are found when its Node
// object does not exist or has none; the default lists the global unicast
// addresses of the host's interfaces that are up. A nil f is ignored.
func WithHostAddresses(f func() ([]netip.Addr, error)) Option {
	return func(o *options) {
		if f != nil {
			o.hostAddresses = f
		}
	}
}

// WithServicePortMaker and WithEndpointMaker make the change trackers build
// the backend's own ServicePort and Endpoint types (see
// changetracker.NewServiceChangeTracker), so that a backend computes what
// it needs of a port or an endpoint once per change rather than at every
// sync. nil means the base types.
func WithServicePortMaker(f changetracker.MakeServicePortFunc) Option {
	return func(o *options) { o.makeServicePort = f }
}

// WithEndpointMaker: see WithServicePortMaker.
func WithEndpointMaker(f changetracker.MakeEndpointFunc) Option {
	return func(o *options) { o.makeEndpoint = f }
}

// WithNodeHandler registers h on the Proxier's informer of this node's
// Node object, before its first list, so that h sees every event of it,
// the first list's included, and OnNodeSynced once that list is in.
// Handlers are called one after the other, in the order of the options,
// before the Proxier's own handler of the node's addresses. Package
// kubeproxy's exit on a node change (Config.ExitOnNodeChange) is one. A
// nil h is ignored.
func WithNodeHandler(h config.NodeHandler) Option {
	return func(o *options) {
		if h != nil {
			o.nodeHandlers = append(o.nodeHandlers, h)
		}
	}
}
