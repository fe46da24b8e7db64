package healthz

import (
	"context"
	"net"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"
)

// ListenFunc opens a listener, as (*net.ListenConfig).Listen does. Servers
// call it with network "tcp" and an address "host:port".
type ListenFunc func(ctx context.Context, network, address string) (net.Listener, error)

// Option configures a server made by [NewProxyHealthServer] or
// [NewServiceHealthServer]. An option that does not apply to a server is
// ignored by it.
type Option func(*options)

type options struct {
	clock     clock.PassiveClock
	listen    ListenFunc
	addresses []netip.Addr
	// healthzTotal and livezTotal count the proxy health server's
	// answers by status code; nil counts nothing.
	healthzTotal, livezTotal *prometheus.CounterVec
}

func newOptions(opts []Option) options {
	o := options{
		clock: clock.RealClock{},
		listen: func(ctx context.Context, network, address string) (net.Listener, error) {
			var lc net.ListenConfig
			return lc.Listen(ctx, network, address)
		},
	}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// WithClock makes the proxy health server read time from c instead of the
// real clock; tests pass a k8s.io/utils/clock/testing fake. A nil c is
// ignored.
func WithClock(c clock.PassiveClock) Option {
	return func(o *options) {
		if c != nil {
			o.clock = c
		}
	}
}

// WithListenFunc makes both servers open their listeners with f instead of
// net.ListenConfig.Listen: tests pass in-memory listeners, and a proxier
// may pass one that sets socket options. A nil f is ignored.
func WithListenFunc(f ListenFunc) Option {
	return func(o *options) {
		if f != nil {
			o.listen = f
		}
	}
}

// WithNodeAddresses makes the service health server listen on each
// health-check node port on these addresses only (as kube-proxy does with
// --nodeport-addresses), instead of on all addresses. Invalid addresses are
// skipped; no valid address means all addresses.
// ServiceHealthServer.SetNodeAddresses changes them while it runs.
func WithNodeAddresses(addrs ...netip.Addr) Option {
	return func(o *options) { o.addresses = validAddresses(addrs) }
}

// WithProbeCounters makes the proxy health server count its answers by
// status: each /healthz response adds one to healthz's series whose "code"
// label is the status code ("200" or "503"), each /livez response to
// livez's. The vectors must have the one label "code"; the caller
// registers them where it wants them (kube-proxy's are
// kubeproxy_proxy_healthz_total and kubeproxy_proxy_livez_total, which
// package proxier registers on its registerer). Either may be nil, which
// counts nothing for that path; the service health server ignores the
// option.
func WithProbeCounters(healthz, livez *prometheus.CounterVec) Option {
	return func(o *options) {
		o.healthzTotal, o.livezTotal = healthz, livez
	}
}
