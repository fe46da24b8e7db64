package changetracker

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"
)

// The fuzz targets decode JSON into API objects, so that the engine mutates
// real field values. Seeds live in testdata/fuzz/<target>/. Run with e.g.
//
//	go test -run XXX -fuzz FuzzServiceChangeTracker -fuzztime 60s ./changetracker/

// serviceEvents is the input of FuzzServiceChangeTracker: a sequence of
// Service states; an entry with "delete": true deletes the Service of that
// namespace and name.
type serviceEvents []struct {
	Delete  bool       `json:"delete,omitempty"`
	Service v1.Service `json:"service"`
}

// FuzzServiceChangeTracker feeds Service events through both families'
// trackers, one Update every few events, and checks that the result equals a
// fresh load of the final states, that every stored port is sane, that the
// results' health-check node ports keep up with the map's, and that deleting
// everything empties the map.
func FuzzServiceChangeTracker(f *testing.F) {
	f.Add([]byte(`[{"service":{"metadata":{"namespace":"ns","name":"a"},"spec":{"clusterIPs":["10.0.0.1","fd00::1"],"ports":[{"name":"p","port":80,"protocol":"UDP"}]}}},{"delete":true,"service":{"metadata":{"namespace":"ns","name":"a"}}}]`))
	quiet := WithLogger(klog.Logger{}) // the zero Logger discards, errors too
	f.Fuzz(func(t *testing.T, data []byte) {
		var events serviceEvents
		if err := json.Unmarshal(data, &events); err != nil || len(events) > 64 {
			return
		}
		for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			tr := NewServiceChangeTracker(family, nil, quiet)
			m := ServicePortMap{}
			last := map[types.NamespacedName]*v1.Service{}
			// The health-check node ports kept from the results alone.
			health := map[types.NamespacedName]uint16{}
			update := func() {
				res := m.Update(tr)
				if err := applyHealthChanges(health, res.HealthCheckNodePorts, res.UpdatedServices); err != nil {
					t.Fatalf("%s: %v", family, err)
				}
				if diff := cmp.Diff(m.HealthCheckNodePorts(), health); diff != "" {
					t.Fatalf("%s: health-check node ports kept from the results differ from the map's (-map +results):\n%s", family, diff)
				}
			}
			for i := range events {
				svc := events[i].Service.DeepCopy()
				nn := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
				if events[i].Delete {
					if prev := last[nn]; prev != nil {
						tr.Update(prev, nil)
						delete(last, nn)
					}
				} else {
					tr.Update(last[nn], svc)
					last[nn] = svc
				}
				if i%3 == 2 {
					update()
				}
			}
			update()
			checkServicePortMap(t, family, m)

			fresh := NewServiceChangeTracker(family, nil, quiet)
			fm := ServicePortMap{}
			for _, svc := range last {
				fresh.Update(nil, svc)
			}
			fm.Update(fresh)
			if diff := cmp.Diff(describeServicePortMap(fm), describeServicePortMap(m)); diff != "" {
				t.Fatalf("%s: incremental map differs from a fresh load (-fresh +incremental):\n%s", family, diff)
			}

			for _, svc := range last {
				tr.Update(svc, nil)
			}
			update()
			if len(m) != 0 {
				t.Fatalf("%s: map not empty after deleting every service: %v", family, describeServicePortMap(m))
			}
		}
	})
}

// checkPortName fails unless the names in name pass the API server's
// checks.
func checkPortName(t *testing.T, name ServicePortName) {
	t.Helper()
	for _, label := range []string{name.Namespace, name.Name} {
		if msgs := validation.IsDNS1123Label(label); len(msgs) > 0 {
			t.Fatalf("%s: stored with invalid name %q: %v", name, label, msgs)
		}
	}
	if name.Port != "" {
		if msgs := validation.IsDNS1123Label(name.Port); len(msgs) > 0 {
			t.Fatalf("%s: stored with invalid port name: %v", name, msgs)
		}
	}
}

func checkServicePortMap(t *testing.T, family v1.IPFamily, m ServicePortMap) {
	t.Helper()
	for name, p := range m {
		// Every text and number that reaches a payload passed the API
		// server's checks.
		checkPortName(t, name)
		if np := p.NodePort(); np < 0 || np > 65535 {
			t.Fatalf("%s: node port %d out of range", name, np)
		}
		if hc := p.HealthCheckNodePort(); hc < 0 || hc > 65535 {
			t.Fatalf("%s: health-check node port %d out of range", name, hc)
		}
		if p.SessionAffinityType() == v1.ServiceAffinityClientIP && (p.StickyMaxAgeSeconds() < 1 || p.StickyMaxAgeSeconds() > maxClientIPAffinitySeconds) {
			t.Fatalf("%s: affinity timeout %d out of range", name, p.StickyMaxAgeSeconds())
		}
		for _, ip := range p.ExternalIPs() {
			if r := SpecialAddressReason(ip); r != "" {
				t.Fatalf("%s: external IP %s is a %s", name, ip, r)
			}
		}
		if familyOf(p.ClusterIP()) != family {
			t.Fatalf("%s: cluster IP %s is not %s", name, p.ClusterIP(), family)
		}
		if p.Port() < 1 || p.Port() > 65535 {
			t.Fatalf("%s: port %d out of range", name, p.Port())
		}
		if p.Protocol() != name.Protocol {
			t.Fatalf("%s: protocol %s differs from its name's", name, p.Protocol())
		}
		for _, ip := range slices.Concat(p.ExternalIPs(), p.LoadBalancerVIPs()) {
			if familyOf(ip) != family {
				t.Fatalf("%s: external or LB address %s is not %s", name, ip, family)
			}
		}
		for _, r := range p.LoadBalancerSourceRanges() {
			if familyOf(r.Addr()) != family || !r.IsValid() {
				t.Fatalf("%s: source range %s is not a valid %s prefix", name, r, family)
			}
		}
	}
}

// sliceEvents is the input of FuzzEndpointSlices: slice events, then a
// Service whose ports are categorized, and this node's name and zone.
type sliceEvents struct {
	Events []struct {
		Delete bool                      `json:"delete,omitempty"`
		Slice  discoveryv1.EndpointSlice `json:"slice"`
	} `json:"events"`
	Service v1.Service `json:"service"`
	Node    string     `json:"node"`
	Zone    string     `json:"zone"`
}

// FuzzEndpointSlices feeds EndpointSlice events through both families'
// trackers and checks the lists (sorted, unique, right family, valid ports),
// that the incremental map equals a fresh load of the final slices, that the
// results' local ready endpoint counts keep up with the map's, that
// CategorizeEndpoints returns subsets consistent with its contract, and that
// deleting every slice empties the map.
func FuzzEndpointSlices(f *testing.F) {
	f.Add([]byte(`{"node":"n1","zone":"z1","service":{"metadata":{"namespace":"ns","name":"a"},"spec":{"clusterIP":"10.0.0.1","ports":[{"name":"p","port":80}]}},"events":[{"slice":{"metadata":{"namespace":"ns","name":"a-1","labels":{"kubernetes.io/service-name":"a"}},"addressType":"IPv4","ports":[{"name":"p","port":8080}],"endpoints":[{"addresses":["10.1.0.1"],"nodeName":"n1","hints":{"forZones":[{"name":"z1"}]}}]}}]}`))
	quiet := WithLogger(klog.Logger{}) // the zero Logger discards, errors too
	f.Fuzz(func(t *testing.T, data []byte) {
		var in sliceEvents
		if err := json.Unmarshal(data, &in); err != nil || len(in.Events) > 64 {
			return
		}
		nodeLabels := map[string]string{v1.LabelTopologyZone: in.Zone}
		for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			tr := NewEndpointsChangeTracker(family, in.Node, nil, quiet)
			m := EndpointsMap{}
			last := map[types.NamespacedName]*discoveryv1.EndpointSlice{}
			// The local ready endpoint counts kept from the results alone.
			local := map[types.NamespacedName]int{}
			update := func() {
				res := m.Update(tr)
				if err := applyHealthChanges(local, res.LocalReadyEndpoints, res.UpdatedServices); err != nil {
					t.Fatalf("%s: %v", family, err)
				}
				if diff := cmp.Diff(m.LocalReadyEndpoints(), local); diff != "" {
					t.Fatalf("%s: local ready endpoints kept from the results differ from the map's (-map +results):\n%s", family, diff)
				}
			}
			for i := range in.Events {
				s := in.Events[i].Slice.DeepCopy()
				key := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
				if in.Events[i].Delete {
					if prev := last[key]; prev != nil {
						tr.EndpointSliceUpdate(prev, true)
						delete(last, key)
					}
				} else {
					// A slice never changes its service label or address
					// type in the API; an event that does is a new object
					// as far as this test's bookkeeping goes.
					if prev := last[key]; prev != nil && (prev.Labels[discoveryv1.LabelServiceName] != s.Labels[discoveryv1.LabelServiceName] || prev.AddressType != s.AddressType) {
						tr.EndpointSliceUpdate(prev, true)
					}
					tr.EndpointSliceUpdate(s, false)
					last[key] = s
				}
				if i%3 == 2 {
					update()
				}
			}
			update()
			checkEndpointsMap(t, family, m)

			fresh := NewEndpointsChangeTracker(family, in.Node, nil, quiet)
			fm := EndpointsMap{}
			for _, s := range last {
				fresh.EndpointSliceUpdate(s, false)
			}
			fm.Update(fresh)
			if diff := cmp.Diff(describeEndpointsMap(fm), describeEndpointsMap(m)); diff != "" {
				t.Fatalf("%s: incremental map differs from a fresh load (-fresh +incremental):\n%s", family, diff)
			}

			svcTracker := NewServiceChangeTracker(family, nil, quiet)
			svcTracker.Update(nil, &in.Service)
			svcMap := ServicePortMap{}
			svcMap.Update(svcTracker)
			policies := []ServicePort{
				&BaseServicePort{},
				&BaseServicePort{internalPolicyLocal: true},
				&BaseServicePort{externalPolicyLocal: true, nodePort: 30000},
			}
			for _, p := range svcMap {
				policies = append(policies, p)
			}
			for name, eps := range m {
				for _, p := range policies {
					checkCategorize(t, name, eps, p, in.Node, nodeLabels)
				}
			}

			for _, s := range last {
				tr.EndpointSliceUpdate(s, true)
			}
			update()
			if len(m) != 0 {
				t.Fatalf("%s: map not empty after deleting every slice: %v", family, describeEndpointsMap(m))
			}
		}
	})
}

func checkEndpointsMap(t *testing.T, family v1.IPFamily, m EndpointsMap) {
	t.Helper()
	for name, eps := range m {
		if len(eps) == 0 {
			t.Fatalf("%s: empty endpoint list stored", name)
		}
		checkPortName(t, name)
		if !validProtocol(name.Protocol) {
			t.Fatalf("%s: stored with protocol %q", name, name.Protocol)
		}
		for i, ep := range eps {
			if familyOf(ep.IP()) != family {
				t.Fatalf("%s: endpoint %s is not %s", name, ep, family)
			}
			if r := SpecialAddressReason(ep.IP()); r != "" {
				t.Fatalf("%s: endpoint %s is a %s", name, ep, r)
			}
			if ep.Port() < 1 || ep.Port() > 65535 {
				t.Fatalf("%s: endpoint %s has port out of range", name, ep)
			}
			// kube-proxy's order: by "ip:port" string, no duplicates.
			if i > 0 && eps[i-1].String() >= ep.String() {
				t.Fatalf("%s: endpoints not sorted or duplicated: %s then %s", name, eps[i-1], ep)
			}
		}
	}
}

func checkCategorize(t *testing.T, name ServicePortName, eps []Endpoint, svc ServicePort, node string, labels map[string]string) {
	t.Helper()
	cluster, local, all, anyEP := CategorizeEndpoints(eps, svc, node, labels)
	in := map[string]Endpoint{}
	anyUsable := false
	for _, ep := range eps {
		in[ep.String()] = ep
		if ep.IsReady() || (ep.IsServing() && ep.IsTerminating()) {
			anyUsable = true
		}
	}
	subset := func(what string, list []Endpoint) map[string]bool {
		seen := map[string]bool{}
		for _, ep := range list {
			if in[ep.String()] != ep {
				t.Fatalf("%s %s: %s endpoint %s is not an input endpoint", name, svc, what, ep)
			}
			if seen[ep.String()] {
				t.Fatalf("%s %s: %s endpoint %s listed twice", name, svc, what, ep)
			}
			seen[ep.String()] = true
		}
		return seen
	}
	c, l, a := subset("cluster", cluster), subset("local", local), subset("all", all)
	for k := range l {
		if !in[k].IsLocal() {
			t.Fatalf("%s %s: local endpoint %s is not local", name, svc, k)
		}
	}
	union := map[string]bool{}
	for k := range c {
		union[k] = true
	}
	for k := range l {
		union[k] = true
	}
	if diff := cmp.Diff(union, a); diff != "" {
		t.Fatalf("%s %s: allReachable is not cluster ∪ local (-union +all):\n%s", name, svc, diff)
	}
	if !svc.UsesClusterEndpoints() && len(cluster) > 0 {
		t.Fatalf("%s %s: cluster endpoints for a service that uses none", name, svc)
	}
	if !svc.UsesLocalEndpoints() && len(local) > 0 {
		t.Fatalf("%s %s: local endpoints for a service that uses none", name, svc)
	}
	if anyEP != anyUsable {
		t.Fatalf("%s %s: hasAnyEndpoints = %v, but usable endpoints exist: %v", name, svc, anyEP, anyUsable)
	}
	if svc.UsesClusterEndpoints() && anyUsable && len(cluster) == 0 {
		t.Fatalf("%s %s: usable endpoints exist but none for cluster traffic", name, svc)
	}
}
