package changetracker

import (
	"net/netip"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// TrackerOption configures a ServiceChangeTracker or an
// EndpointsChangeTracker. Options that do not apply to a tracker are ignored
// by it.
type TrackerOption func(*trackerOptions)

type trackerOptions struct {
	logger  klog.Logger
	clock   clock.PassiveClock
	nodeIPs []netip.Addr
}

func newTrackerOptions(opts []TrackerOption) trackerOptions {
	o := trackerOptions{
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

// WithLogger makes the tracker log through logger (typically
// klog.FromContext(ctx) of the proxier). The default is klog.Background().
func WithLogger(logger klog.Logger) TrackerOption {
	return func(o *trackerOptions) { o.logger = logger }
}

// WithClock sets the clock the EndpointsChangeTracker reads its start time
// from: last-change-trigger times from before the tracker started are not
// reported, since they would measure the proxy's own start-up, not
// network-programming latency. A nil clock is ignored. The default is the real
// clock.
func WithClock(c clock.PassiveClock) TrackerOption {
	return func(o *trackerOptions) {
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
// the option no address counts as the node's.
func WithNodeIPs(ips ...netip.Addr) TrackerOption {
	var own []netip.Addr
	for _, ip := range ips {
		if ip.IsValid() {
			own = append(own, ip.Unmap().WithZone(""))
		}
	}
	return func(o *trackerOptions) { o.nodeIPs = append(o.nodeIPs, own...) }
}
