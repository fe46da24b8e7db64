package main

import (
	"context"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/changetracker"
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
		ct := env.conntrack
		opts = append(opts, proxier.WithConntrack(proxier.ConntrackCleanerFunc(
			func(ctx context.Context, family v1.IPFamily, svcs changetracker.ServicePortMap, eps changetracker.EndpointsMap, deleted sets.Set[netip.Addr]) (int, error) {
				return conntrack.CleanStaleEntries(ctx, ct, family, svcs, eps, conntrack.WithDeletedClusterIPs(deleted))
			})))
	}
	return opts
}
