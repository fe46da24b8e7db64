package main

import (
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/proxier"
)

// proxierOptions translates the command line into the proxier package's
// options: the sync periods, conntrack cleanup (not in a dry run), the
// health servers, and the metrics on reg.
func proxierOptions(o *options, env *environment, reg prometheus.Registerer) []proxier.Option {
	opts := []proxier.Option{
		proxier.WithSyncPeriods(o.minSyncPeriod, o.syncPeriod),
		proxier.WithProxyHealthServer(o.healthzBindAddress),
		proxier.WithServiceHealthServer(func(n proxier.Node) []netip.Addr { return healthCheckAddresses(o, n) }),
		proxier.WithListenFunc(env.listen),
		proxier.WithMetricsRegisterer(reg),
		proxier.WithHostAddresses(env.hostAddresses),
	}
	if !o.dryRun && env.conntrack != nil {
		opts = append(opts, proxier.WithConntrack(conntrack.NewCleaner(env.conntrack)))
	}
	return opts
}
