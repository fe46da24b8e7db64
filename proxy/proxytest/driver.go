package proxytest

import (
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/proxy"
)

// driver stands in for the composition in front of one Backend: it feeds
// Service and EndpointSlice objects through the real change trackers of
// each family and builds the inputs of a Sync as the proxier does (Full on
// the first one, ChangedServices from both change results).
type driver struct {
	node     proxy.NodeConfig
	fams     []*familyMaps
	services map[types.NamespacedName]*v1.Service
	slices   map[types.NamespacedName]*discoveryv1.EndpointSlice
	nodeIPs  []netip.Addr
	labels   map[string]string
	// synced is set once a Sync succeeded with one result per input:
	// until then every input is Full, as the composition makes a
	// Backend's first sync.
	synced bool
}

// familyMaps is one family's trackers and the maps they keep.
type familyMaps struct {
	family v1.IPFamily
	svcs   *changetracker.ServiceChangeTracker
	eps    *changetracker.EndpointsChangeTracker
	svcMap changetracker.ServicePortMap
	epMap  changetracker.EndpointsMap
}

func newDriver(logger klog.Logger, families []v1.IPFamily, node proxy.NodeConfig, nodeIPs []netip.Addr, labels map[string]string) *driver {
	d := &driver{
		node:     node,
		services: map[types.NamespacedName]*v1.Service{},
		slices:   map[types.NamespacedName]*discoveryv1.EndpointSlice{},
		nodeIPs:  nodeIPs,
		labels:   labels,
	}
	for _, family := range families {
		d.fams = append(d.fams, &familyMaps{
			family: family,
			svcs: changetracker.NewServiceChangeTracker(family, nil,
				changetracker.WithLogger(logger), changetracker.WithNodeIPs(nodeIPs...)),
			eps:    changetracker.NewEndpointsChangeTracker(family, node.Name, nil, changetracker.WithLogger(logger)),
			svcMap: changetracker.ServicePortMap{},
			epMap:  changetracker.EndpointsMap{},
		})
	}
	return d
}

// replay returns a driver of the same families and node whose trackers
// have seen d's objects as they are now, and nothing else: what a fresh
// composition would hand a fresh Backend.
func (d *driver) replay(logger klog.Logger) *driver {
	families := make([]v1.IPFamily, len(d.fams))
	for i, f := range d.fams {
		families[i] = f.family
	}
	r := newDriver(logger, families, d.node, d.nodeIPs, d.labels)
	for _, svc := range d.services {
		r.apply(change{svc: svc})
	}
	for _, s := range d.slices {
		r.apply(change{slice: s})
	}
	return r
}

// change is one informer event: a Service or an EndpointSlice added or
// updated, or deleted when delete is set.
type change struct {
	svc    *v1.Service
	slice  *discoveryv1.EndpointSlice
	delete bool
}

// apply hands ch to the trackers, as the proxier's informer handlers do:
// a Service to every family's, a slice to its address type's.
func (d *driver) apply(ch change) {
	if ch.svc != nil {
		key := types.NamespacedName{Namespace: ch.svc.Namespace, Name: ch.svc.Name}
		previous, current := d.services[key], ch.svc
		if ch.delete {
			current = nil
			delete(d.services, key)
		} else {
			d.services[key] = current
		}
		for _, f := range d.fams {
			f.svcs.Update(previous, current)
		}
	}
	if ch.slice != nil {
		key := types.NamespacedName{Namespace: ch.slice.Namespace, Name: ch.slice.Name}
		if ch.delete {
			delete(d.slices, key)
		} else {
			d.slices[key] = ch.slice
		}
		for _, f := range d.fams {
			if string(f.family) == string(ch.slice.AddressType) {
				f.eps.EndpointSliceUpdate(ch.slice, ch.delete)
			}
		}
	}
}

// inputs brings the maps up to date and returns one input per family, in
// the Backend's order; they are Full when full is set or no Sync has
// succeeded yet.
func (d *driver) inputs(full bool) []*proxy.FamilyInput {
	ins := make([]*proxy.FamilyInput, len(d.fams))
	for i, f := range d.fams {
		in := &proxy.FamilyInput{
			Family:          f.family,
			Services:        f.svcMap,
			Endpoints:       f.epMap,
			ServiceChanges:  f.svcMap.Update(f.svcs),
			EndpointChanges: f.epMap.Update(f.eps),
			Full:            full || !d.synced,
			NodeLabels:      d.labels,
			NodeIPs:         proxy.NodeIPsOf(f.family, d.nodeIPs),
		}
		in.ChangedServices = changedServices(in)
		ins[i] = in
	}
	return ins
}

// changedServices is FamilyInput.ChangedServices of in, found by walking
// its Services: the suite's maps are small, and walking cannot get the
// index wrong.
func changedServices(in *proxy.FamilyInput) map[types.NamespacedName][]changetracker.ServicePortName {
	out := map[types.NamespacedName][]changetracker.ServicePortName{}
	for svc := range in.ServiceChanges.UpdatedServices {
		out[svc] = nil
	}
	for svc := range in.EndpointChanges.UpdatedServices {
		out[svc] = nil
	}
	for name := range in.Services {
		if ports, ok := out[name.NamespacedName]; ok {
			out[name.NamespacedName] = append(ports, name)
		}
	}
	for _, ports := range out {
		slices.SortFunc(ports, changetracker.CompareServicePortNames)
	}
	return out
}
