// Package writertest builds the input of the service rule writers'
// tests (iptables and nftables): Services and EndpointSlices as the API
// server would send them, fed through the real change trackers into the
// maps a writer reads, so that both writers are tested on the same
// objects. It is not for the proxier's tests, which start from API
// objects in a fake clientset (internal/testkit/clustertest).
package writertest

import (
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/proxy"
)

// Cluster is a proxier's view of a cluster for one IP family: the
// Services and EndpointSlices set on it go through the change trackers,
// and Update applies them to ServiceMap and EndpointsMap, as a proxier's
// sync does. Its fields are open so that a test can hand the maps to a
// writer or corrupt them on purpose.
type Cluster struct {
	Family          v1.IPFamily
	ServiceTracker  *changetracker.ServiceChangeTracker
	EndpointTracker *changetracker.EndpointsChangeTracker
	ServiceMap      changetracker.ServicePortMap
	EndpointsMap    changetracker.EndpointsMap
	// NodeLabels are the labels of this node (topology); nil by default.
	NodeLabels map[string]string
	// NodeIPs are this node's addresses, for the writers'
	// proxy.FamilyInput.NodeIPs; nil by default.
	NodeIPs []netip.Addr
	// PodCIDRs are this node's pod ranges, for the writers'
	// proxy.FamilyInput.PodCIDRs; nil by default.
	PodCIDRs []netip.Prefix
	// Services are the Services set, by namespace/name.
	Services map[string]*v1.Service
	// Slices are the EndpointSlices set, by namespace/name of the slice.
	Slices map[string]*discoveryv1.EndpointSlice
}

// NewCluster returns an empty Cluster of family whose trackers see node
// as this node. The trackers log only at verbosity 10, so that the tests
// that feed them bad objects on purpose stay quiet.
func NewCluster(family v1.IPFamily, node string) *Cluster {
	quiet := changetracker.WithLogger(klog.Background().V(10))
	return &Cluster{
		Family:          family,
		ServiceTracker:  changetracker.NewServiceChangeTracker(family, nil, quiet),
		EndpointTracker: changetracker.NewEndpointsChangeTracker(family, node, nil, quiet),
		ServiceMap:      changetracker.ServicePortMap{},
		EndpointsMap:    changetracker.EndpointsMap{},
		Services:        map[string]*v1.Service{},
		Slices:          map[string]*discoveryv1.EndpointSlice{},
	}
}

// SetService adds svc, or replaces the Service of the same namespace and
// name.
func (c *Cluster) SetService(svc *v1.Service) {
	key := svc.Namespace + "/" + svc.Name
	c.ServiceTracker.Update(c.Services[key], svc)
	c.Services[key] = svc
}

// DeleteService deletes Service ns/name; the tracker ignores the deletion
// of a Service it never saw.
func (c *Cluster) DeleteService(ns, name string) {
	key := ns + "/" + name
	c.ServiceTracker.Update(c.Services[key], nil)
	delete(c.Services, key)
}

// SetEndpoints replaces the endpoints of Service ns/name with eps, on
// ports, in the one slice Slice makes for it (of c's family).
func (c *Cluster) SetEndpoints(ns, name string, ports []discoveryv1.EndpointPort, eps ...Endpoint) {
	s := Slice(c.Family, ns, name, ports, eps...)
	c.EndpointTracker.EndpointSliceUpdate(s, false)
	c.Slices[ns+"/"+s.Name] = s
}

// DeleteEndpoints deletes the slice SetEndpoints set for Service ns/name;
// it does nothing if there is none.
func (c *Cluster) DeleteEndpoints(ns, name string) {
	key := ns + "/" + name + "-1"
	if s := c.Slices[key]; s != nil {
		c.EndpointTracker.EndpointSliceUpdate(s, true)
		delete(c.Slices, key)
	}
}

// Update applies the trackers' pending changes to ServiceMap and
// EndpointsMap and returns what changed, for a writer's SyncInput.
func (c *Cluster) Update() (changetracker.UpdateServiceMapResult, changetracker.UpdateEndpointsMapResult) {
	return c.ServiceMap.Update(c.ServiceTracker), c.EndpointsMap.Update(c.EndpointTracker)
}

// MarkChanged records in r what Update would have said had the tracker
// seen name added: its Service is updated and name is among the
// Service's ports. It is for a port a test puts in ServiceMap by hand
// (one no tracker would make), so that a writer's partial sync
// considers it. r must come from Update or have nil Ports (a result
// without Ports makes a writer walk the map instead).
func MarkChanged(r *changetracker.UpdateServiceMapResult, name changetracker.ServicePortName) {
	r.UpdatedServices.Insert(name.NamespacedName)
	if r.Ports == nil {
		return
	}
	ports := r.Ports[name.NamespacedName]
	if slices.Contains(ports, name) {
		return
	}
	// A new slice: the one Update made may be shared.
	ports = append(slices.Clip(ports), name)
	slices.SortFunc(ports, changetracker.CompareServicePortNames)
	r.Ports[name.NamespacedName] = ports
}

// Input applies the pending changes to the maps and returns a writer's
// input, with the Cluster's node labels, addresses and pod ranges.
func (c *Cluster) Input() *proxy.FamilyInput {
	svcChanges, epChanges := c.Update()
	return &proxy.FamilyInput{
		Services:        c.ServiceMap,
		Endpoints:       c.EndpointsMap,
		ServiceChanges:  svcChanges,
		EndpointChanges: epChanges,
		NodeLabels:      c.NodeLabels,
		NodeIPs:         c.NodeIPs,
		PodCIDRs:        c.PodCIDRs,
	}
}
