// Package changetracker turns Kubernetes Services and EndpointSlices into the
// per-port maps a service proxy programs into the kernel, the way kube-proxy
// does, as a block any proxy can import.
//
// A proxier keeps, per IP family, a ServiceChangeTracker and an
// EndpointsChangeTracker fed from informer event handlers, and a ServicePortMap
// and an EndpointsMap owned by its sync goroutine. Handlers record changes
// (cheaply, coalescing repeated changes to one object); the sync calls Update
// on each map, which applies only what changed and reports which Services
// changed, which UDP conntrack entries may be stale and the trigger times for
// latency metrics. CategorizeEndpoints then picks, for one service port, the
// endpoints this node should use under the traffic policies, topology hints
// and the terminating-endpoint fallback. The informer glue (ServiceConfig,
// EndpointSliceConfig, NodeConfig, NewInformerFactory) wires handlers to a
// client-go SharedInformerFactory with kube-proxy's label selector, and
// NodeTopology follows this node's topology labels.
//
// It is not a proxier: it renders no rules, touches no kernel state and
// decides nothing about when to sync (see the runner package for that).
//
// The smallest use, in a sync function:
//
//	svcTracker := changetracker.NewServiceChangeTracker(v1.IPv4Protocol, nil)
//	epTracker := changetracker.NewEndpointsChangeTracker(v1.IPv4Protocol, nodeName, nil)
//	svcMap, epMap := changetracker.ServicePortMap{}, changetracker.EndpointsMap{}
//	// informer handlers: svcTracker.Update(old, new); epTracker.EndpointSliceUpdate(slice, deleted)
//	svcMap.Update(svcTracker)
//	epMap.Update(epTracker)
//	for name, svc := range svcMap {
//		cluster, local, all, any := changetracker.CategorizeEndpoints(epMap[name], svc, nodeName, nodeLabels)
//		// program cluster/local/all into the kernel
//	}
//
// Dual-stack: use one tracker pair per family. A dual-stack Service shows up in
// both, a single-stack one only in its family's.
package changetracker
