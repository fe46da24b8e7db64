// Package config feeds a proxier's change trackers from client-go
// informers, as kube-proxy's pkg/proxy/config does: ServiceConfig,
// EndpointSliceConfig, NodeConfig and ServiceCIDRConfig deliver an
// informer's events to handlers (ServiceHandler, EndpointSliceHandler,
// NodeHandler, ServiceCIDRHandler), unwrapping the tombstones of missed
// deletions, and tell them once the initial list has been delivered
// (ServiceCIDRConfig does not wait through a failing list: an older API
// server does not serve ServiceCIDRs); NewServiceInformerFactory,
// NewEndpointSliceInformerFactory and NewNodeInformerFactory make the
// SharedInformerFactories with kube-proxy's selectors (Services by the
// service-proxy-name label and a cluster IP other than None,
// EndpointSlices by the headless label, the Node by its name).
//
// It is the informer half that package changetracker leaves out, so that
// importing the trackers alone does not compile client-go's informers and
// clientset. Package proxier uses it to run a whole proxy; use it directly
// only to compose the blocks yourself.
//
// The smallest use:
//
//	factory := config.NewServiceInformerFactory(client, 0)
//	svcConfig, err := config.NewServiceConfig(ctx, factory.Core().V1().Services(), 0)
//	// handle err
//	svcConfig.RegisterEventHandler(h) // h.OnServiceAdd calls svcTracker.Update(nil, svc), ...
//	factory.Start(ctx.Done())
//	if !svcConfig.Run(ctx) { /* ctx ended before the initial list */ }
package config
