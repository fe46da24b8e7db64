package changetracker

import (
	"net/netip"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Option configures a ServiceChangeTracker, an EndpointsChangeTracker or a
// NodeTopology; one type serves the three constructors so that a logger or a
// clock is passed the same way to each. Each option says which constructors
// read it; the others ignore it.
type Option func(*options)

type options struct {
	logger  klog.Logger
	clock   clock.PassiveClock
	nodeIPs []netip.Addr

	onTopologyChange func(labels map[string]string)
	onNodeDeleted    func()
}

func newOptions(opts []Option) options {
	o := options{
		logger: klog.Background(),
		clock:  clock.RealClock{},
	}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}

// WithLogger makes the tracker or the NodeTopology log through logger
// (typically klog.FromContext(ctx) of the proxier). The default is
// klog.Background(). Read by NewServiceChangeTracker,
// NewEndpointsChangeTracker and NewNodeTopology.
func WithLogger(logger klog.Logger) Option {
	return func(o *options) { o.logger = logger }
}

// WithClock sets the clock the EndpointsChangeTracker reads its start time
// from: last-change-trigger times from before the tracker started are not
// reported, since they would measure the proxy's own start-up, not
// network-programming latency. A nil clock is ignored. The default is the real
// clock. Read by NewEndpointsChangeTracker only.
func WithClock(c clock.PassiveClock) Option {
	return func(o *options) {
		if c != nil {
			o.clock = c
		}
	}
}

// WithNodeIPs gives the ServiceChangeTracker this node's addresses, of
// both families: a Service whose cluster IP is one of them is refused, as
// one the API server would never allocate, because its rules would take
// the node's own ports (sshd's, say) from every client. External and
// load-balancer IPs equal to a node address stay accepted, as the API
// server and kube-proxy accept them (bare-metal load balancers hand out
// node addresses). IPv4-mapped addresses count as IPv4 and invalid ones
// are ignored. The addresses are read when the Service is updated: a
// Service already tracked is not checked again when they change. Without
// the option no address counts as the node's. Read by
// NewServiceChangeTracker only.
func WithNodeIPs(ips ...netip.Addr) Option {
	var own []netip.Addr
	for _, ip := range ips {
		if ip.IsValid() {
			own = append(own, ip.Unmap().WithZone(""))
		}
	}
	return func(o *options) { o.nodeIPs = append(o.nodeIPs, own...) }
}
