package changetracker

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/ptr"
)

// Test builders for Services and EndpointSlices.

func makeService(ns, name string, tweaks ...func(*v1.Service)) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			Ports:      []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	}
	for _, f := range tweaks {
		f(svc)
	}
	return svc
}

func withClusterIPs(ips ...string) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.ClusterIPs = ips
		if len(ips) > 0 {
			s.Spec.ClusterIP = ips[0]
		} else {
			s.Spec.ClusterIP = ""
		}
	}
}

func withPorts(ports ...v1.ServicePort) func(*v1.Service) {
	return func(s *v1.Service) { s.Spec.Ports = ports }
}

func svcPort(name string, port int32, proto v1.Protocol) v1.ServicePort {
	return v1.ServicePort{Name: name, Port: port, Protocol: proto}
}

type ep struct {
	addr        string
	node        string
	zone        string
	ready       *bool
	serving     *bool
	terminating *bool
	zoneHints   []string
	nodeHints   []string
}

func readyEP(addr, node string) ep { return ep{addr: addr, node: node} }

func terminatingEP(addr, node string, serving bool) ep {
	return ep{addr: addr, node: node, ready: ptr.To(false), serving: ptr.To(serving), terminating: ptr.To(true)}
}

func notReadyEP(addr, node string) ep {
	return ep{addr: addr, node: node, ready: ptr.To(false), serving: ptr.To(false), terminating: ptr.To(false)}
}

type port struct {
	name  *string
	port  *int32
	proto *v1.Protocol
}

func namedPort(name string, p int32, proto v1.Protocol) port {
	return port{name: ptr.To(name), port: ptr.To(p), proto: ptr.To(proto)}
}

func makeSlice(ns, svc, name string, at discoveryv1.AddressType, ports []port, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns,
			Name:      name,
			Labels:    map[string]string{discoveryv1.LabelServiceName: svc},
		},
		AddressType: at,
	}
	for _, p := range ports {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: p.name, Port: p.port, Protocol: p.proto})
	}
	for _, e := range eps {
		de := discoveryv1.Endpoint{
			Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Serving: e.serving, Terminating: e.terminating},
		}
		if e.addr != "" {
			de.Addresses = []string{e.addr}
		}
		if e.node != "" {
			de.NodeName = ptr.To(e.node)
		}
		if e.zone != "" {
			de.Zone = ptr.To(e.zone)
		}
		if len(e.zoneHints) > 0 || len(e.nodeHints) > 0 {
			de.Hints = &discoveryv1.EndpointHints{}
			for _, z := range e.zoneHints {
				de.Hints.ForZones = append(de.Hints.ForZones, discoveryv1.ForZone{Name: z})
			}
			for _, n := range e.nodeHints {
				de.Hints.ForNodes = append(de.Hints.ForNodes, discoveryv1.ForNode{Name: n})
			}
		}
		s.Endpoints = append(s.Endpoints, de)
	}
	return s
}

// describeEndpoint renders an Endpoint for diffs: "ip:port" followed by its
// set flags and topology.
func describeEndpoint(e Endpoint) string {
	var b strings.Builder
	b.WriteString(e.String())
	for _, f := range []struct {
		on   bool
		name string
	}{{e.IsLocal(), "local"}, {e.IsReady(), "ready"}, {e.IsServing(), "serving"}, {e.IsTerminating(), "terminating"}} {
		if f.on {
			b.WriteString(" " + f.name)
		}
	}
	if e.NodeName() != "" {
		b.WriteString(" node=" + e.NodeName())
	}
	if e.Zone() != "" {
		b.WriteString(" zone=" + e.Zone())
	}
	if e.ZoneHints().Len() > 0 {
		b.WriteString(" zoneHints=" + strings.Join(sorted(e.ZoneHints().UnsortedList()), ","))
	}
	if e.NodeHints().Len() > 0 {
		b.WriteString(" nodeHints=" + strings.Join(sorted(e.NodeHints().UnsortedList()), ","))
	}
	return b.String()
}

func sorted(s []string) []string {
	sort.Strings(s)
	return s
}

// describeEndpointsMap renders a whole map for diffs, keyed by
// "ns/name:port/PROTO".
func describeEndpointsMap(m EndpointsMap) map[string][]string {
	out := map[string][]string{}
	for name, eps := range m {
		var list []string
		for _, e := range eps {
			list = append(list, describeEndpoint(e))
		}
		out[fmt.Sprintf("%s/%s", name, name.Protocol)] = list
	}
	return out
}

func describeEndpoints(eps []Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.String())
	}
	return out
}

// describeServicePortMap renders a whole map, keyed like describeEndpointsMap,
// with each port's String().
func describeServicePortMap(m ServicePortMap) map[string]string {
	out := map[string]string{}
	for name, p := range m {
		out[fmt.Sprintf("%s/%s", name, name.Protocol)] = p.String()
	}
	return out
}

func namesOf[T fmt.Stringer](items []T) []string {
	var out []string
	for _, i := range items {
		out = append(out, i.String())
	}
	slices.Sort(out)
	return out
}

// applyHealthChanges applies an Update result's per-Service health values
// to state as a proxier that keeps its health checks incrementally does (a
// zero value deletes the Service), after checking that they cover exactly
// the updated Services: a Service missing from them would leave state
// stale.
func applyHealthChanges[V comparable](state, changes map[types.NamespacedName]V, updated sets.Set[types.NamespacedName]) error {
	if !updated.Equal(sets.KeySet(changes)) {
		return fmt.Errorf("health values for %v, want them for the updated services %v", sorted(namesOf(sets.KeySet(changes).UnsortedList())), sorted(namesOf(updated.UnsortedList())))
	}
	var zero V
	for nn, v := range changes {
		if v == zero {
			delete(state, nn)
		} else {
			state[nn] = v
		}
	}
	return nil
}
