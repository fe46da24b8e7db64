// Package healthz serves the two kinds of health checks a service proxy
// answers on a node.
//
// [ProxyHealthServer] answers /healthz and /livez about the proxy itself: a
// proxier calls [ProxyHealthServer.QueuedUpdate] when it learns of a change
// and [ProxyHealthServer.Updated] when a sync has applied it, per IP family;
// when a queued change waits longer than the health timeout the proxy is
// unhealthy. /healthz also fails while the node is being deleted or is
// tainted ToBeDeletedByClusterAutoscaler ([ProxyHealthServer.SyncNode]),
// so that load balancers drain the node first.
//
// [ServiceHealthServer] opens one HTTP listener per health-check node port
// of the Services with externalTrafficPolicy: Local, and answers 200 while
// the Service has endpoints on this node and the proxy is healthy, 503
// otherwise; cloud load balancers probe it to pick nodes.
//
// It is not a metrics endpoint and not a general HTTP server: it serves
// these fixed paths and JSON bodies, and it takes plain maps
// (types.NamespacedName → port, → local endpoint count) so that it does not
// depend on how the proxier tracks services.
//
// The smallest use:
//
//	hs := healthz.NewProxyHealthServer("0.0.0.0:10256", 2*syncPeriod)
//	go hs.Run(ctx)
//	svcHealth := healthz.NewServiceHealthServer(nodeName, hs)
//	// in the proxier's sync:
//	hs.QueuedUpdate(v1.IPv4Protocol) // from event handlers
//	...
//	svcHealth.SyncServices(ctx, svcPortMap.HealthCheckNodePorts())
//	svcHealth.SyncEndpoints(endpointsMap.LocalReadyEndpoints())
//	hs.Updated(v1.IPv4Protocol)
//
// SyncServices and SyncEndpoints take the whole state, which a proxier gets
// by walking its maps. At tens of thousands of Services that walk costs
// more than a partial sync itself, so [ServiceHealthServer.UpdateServices]
// and [ServiceHealthServer.UpdateEndpoints] take only what changed, as
// changetracker's Update results give it:
//
//	svcResult, epResult := svcPortMap.Update(svcTracker), endpointsMap.Update(epTracker)
//	...
//	svcHealth.UpdateServices(ctx, svcResult.HealthCheckNodePorts)
//	svcHealth.UpdateEndpoints(epResult.LocalReadyEndpoints)
package healthz
