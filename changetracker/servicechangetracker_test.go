package changetracker

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2/ktesting"
)

// svcEvent is one call of ServiceChangeTracker.Update.
type svcEvent struct{ prev, cur *v1.Service }

func TestServiceChangeTracker(t *testing.T) {
	a := makeService("ns", "a", withPorts(svcPort("dns", 53, v1.ProtocolUDP), svcPort("dns-tcp", 53, v1.ProtocolTCP)))
	aTCPOnly := makeService("ns", "a", withPorts(svcPort("dns-tcp", 53, v1.ProtocolTCP)))
	aRelabelled := a.DeepCopy()
	aRelabelled.Labels = map[string]string{"x": "y"}
	aHeadless := makeService("ns", "a", withClusterIPs("None"), withPorts(svcPort("dns", 53, v1.ProtocolUDP)))
	b := makeService("ns", "b", withClusterIPs("10.96.0.11"))
	dual := makeService("ns", "dual", withClusterIPs("fd00::12", "10.96.0.12"))
	v6 := makeService("ns", "v6", withClusterIPs("fd00::13"))
	bad := makeService("ns", "bad", withPorts(
		svcPort("ok", 80, v1.ProtocolTCP),
		svcPort("ok", 80, v1.ProtocolTCP),
		svcPort("zero", 0, v1.ProtocolTCP),
		svcPort("big", 70000, v1.ProtocolTCP),
		svcPort("icmp", 1, "ICMP"),
		svcPort("ok", 80, v1.ProtocolUDP),
	))
	nsn := func(n string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: n} }

	type round struct {
		events         []svcEvent
		wantPending    bool
		wantMap        map[string]string
		wantUpdated    []types.NamespacedName
		wantDeletedUDP []string
	}
	tests := []struct {
		name   string
		family v1.IPFamily
		rounds []round
	}{{
		name:   "add, remove a UDP port, delete",
		family: v1.IPv4Protocol,
		rounds: []round{{
			events:      []svcEvent{{nil, a}, {nil, b}},
			wantPending: true,
			wantMap: map[string]string{
				"ns/a:dns/UDP":     "10.96.0.10:53/UDP",
				"ns/a:dns-tcp/TCP": "10.96.0.10:53/TCP",
				"ns/b:http/TCP":    "10.96.0.11:80/TCP",
			},
			wantUpdated: []types.NamespacedName{nsn("a"), nsn("b")},
		}, {
			events:         []svcEvent{{a, aTCPOnly}},
			wantPending:    true,
			wantMap:        map[string]string{"ns/a:dns-tcp/TCP": "10.96.0.10:53/TCP", "ns/b:http/TCP": "10.96.0.11:80/TCP"},
			wantUpdated:    []types.NamespacedName{nsn("a")},
			wantDeletedUDP: []string{"10.96.0.10"},
		}, {
			events:      []svcEvent{{b, nil}},
			wantPending: true,
			wantMap:     map[string]string{"ns/a:dns-tcp/TCP": "10.96.0.10:53/TCP"},
			wantUpdated: []types.NamespacedName{nsn("b")},
		}},
	}, {
		name:   "changes that end where they started are dropped",
		family: v1.IPv4Protocol,
		rounds: []round{{
			events:      []svcEvent{{nil, a}},
			wantPending: true,
			wantMap:     map[string]string{"ns/a:dns/UDP": "10.96.0.10:53/UDP", "ns/a:dns-tcp/TCP": "10.96.0.10:53/TCP"},
			wantUpdated: []types.NamespacedName{nsn("a")},
		}, {
			// Label-only update, then remove a port and put it back.
			events:      []svcEvent{{a, aRelabelled}, {aRelabelled, aTCPOnly}, {aTCPOnly, a}},
			wantPending: false,
			wantMap:     map[string]string{"ns/a:dns/UDP": "10.96.0.10:53/UDP", "ns/a:dns-tcp/TCP": "10.96.0.10:53/TCP"},
		}, {
			// Add and delete of a new service between two syncs.
			events:      []svcEvent{{nil, b}, {b, nil}},
			wantPending: false,
			wantMap:     map[string]string{"ns/a:dns/UDP": "10.96.0.10:53/UDP", "ns/a:dns-tcp/TCP": "10.96.0.10:53/TCP"},
		}},
	}, {
		name:   "service becoming headless loses its ports",
		family: v1.IPv4Protocol,
		rounds: []round{{
			events:      []svcEvent{{nil, a}},
			wantPending: true,
			wantMap:     map[string]string{"ns/a:dns/UDP": "10.96.0.10:53/UDP", "ns/a:dns-tcp/TCP": "10.96.0.10:53/TCP"},
			wantUpdated: []types.NamespacedName{nsn("a")},
		}, {
			events:         []svcEvent{{a, aHeadless}},
			wantPending:    true,
			wantMap:        map[string]string{},
			wantUpdated:    []types.NamespacedName{nsn("a")},
			wantDeletedUDP: []string{"10.96.0.10"},
		}},
	}, {
		name:   "dual-stack, IPv4 tracker",
		family: v1.IPv4Protocol,
		rounds: []round{{
			events:      []svcEvent{{nil, dual}, {nil, v6}},
			wantPending: true,
			wantMap:     map[string]string{"ns/dual:http/TCP": "10.96.0.12:80/TCP"},
			wantUpdated: []types.NamespacedName{nsn("dual")},
		}},
	}, {
		name:   "dual-stack, IPv6 tracker",
		family: v1.IPv6Protocol,
		rounds: []round{{
			events:      []svcEvent{{nil, dual}, {nil, v6}, {nil, a}},
			wantPending: true,
			wantMap:     map[string]string{"ns/dual:http/TCP": "[fd00::12]:80/TCP", "ns/v6:http/TCP": "[fd00::13]:80/TCP"},
			wantUpdated: []types.NamespacedName{nsn("dual"), nsn("v6")},
		}},
	}, {
		name:   "bad ports are skipped, the rest kept",
		family: v1.IPv4Protocol,
		rounds: []round{{
			events:      []svcEvent{{nil, bad}},
			wantPending: true,
			wantMap:     map[string]string{"ns/bad:ok/TCP": "10.96.0.10:80/TCP", "ns/bad:ok/UDP": "10.96.0.10:80/UDP"},
			wantUpdated: []types.NamespacedName{nsn("bad")},
		}},
	}, {
		name:   "nil events",
		family: v1.IPv4Protocol,
		rounds: []round{{
			events:  []svcEvent{{nil, nil}},
			wantMap: map[string]string{},
		}},
	}, {
		name:   "unknown family tracks nothing",
		family: "IPv5",
		rounds: []round{{
			events:  []svcEvent{{nil, a}},
			wantMap: map[string]string{},
		}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logger, _ := ktesting.NewTestContext(t)
			tr := NewServiceChangeTracker(tc.family, nil, WithLogger(logger))
			m := ServicePortMap{}
			for i, r := range tc.rounds {
				var pending bool
				for _, e := range r.events {
					pending = tr.Update(e.prev, e.cur)
				}
				if pending != r.wantPending {
					t.Errorf("round %d: last Update returned %v, want %v", i, pending, r.wantPending)
				}
				res := m.Update(tr)
				if diff := cmp.Diff(r.wantMap, describeServicePortMap(m)); diff != "" {
					t.Errorf("round %d: map (-want +got):\n%s", i, diff)
				}
				if diff := cmp.Diff(sets.New(r.wantUpdated...), res.UpdatedServices); diff != "" {
					t.Errorf("round %d: UpdatedServices (-want +got):\n%s", i, diff)
				}
				var deleted []string
				for ip := range res.DeletedUDPClusterIPs {
					deleted = append(deleted, ip.String())
				}
				if diff := cmp.Diff(sorted(r.wantDeletedUDP), sorted(deleted)); diff != "" {
					t.Errorf("round %d: DeletedUDPClusterIPs (-want +got):\n%s", i, diff)
				}
				if n := tr.PendingChanges().Len(); n != 0 {
					t.Errorf("round %d: %d changes still pending after Update", i, n)
				}
			}
		})
	}
}

// chainPort is a user ServicePort type embedding the base one.
type chainPort struct {
	*BaseServicePort
	chain string
}

func TestMakeServicePortFunc(t *testing.T) {
	mk := func(port *v1.ServicePort, svc *v1.Service, base *BaseServicePort) ServicePort {
		if port.Name == "skip" {
			return (*chainPort)(nil)
		}
		return &chainPort{BaseServicePort: base, chain: "KUBE-SVC-" + svc.Name + "-" + port.Name}
	}
	tr := NewServiceChangeTracker(v1.IPv4Protocol, mk)
	svc := makeService("ns", "a", withPorts(svcPort("http", 80, v1.ProtocolTCP), svcPort("skip", 81, v1.ProtocolTCP)))
	tr.Update(nil, svc)
	m := ServicePortMap{}
	m.Update(tr)
	got := map[string]string{}
	for name, p := range m {
		got[name.String()] = p.(*chainPort).chain
	}
	want := map[string]string{"ns/a:http": "KUBE-SVC-a-http"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("custom ports (-want +got):\n%s", diff)
	}
	// The same service again is not a change, even with custom types.
	if tr.Update(svc, svc.DeepCopy()) {
		t.Error("an identical update was recorded as a change")
	}
}

func TestServicePortMapUpdateNilTracker(t *testing.T) {
	m := ServicePortMap{}
	res := m.Update(nil)
	if res.UpdatedServices == nil || res.DeletedUDPClusterIPs == nil || res.HealthCheckNodePorts == nil || res.Ports == nil || len(m) != 0 {
		t.Errorf("Update(nil) = %+v, map %v; want empty non-nil sets and maps and no change", res, m)
	}
}

// TestUpdateServiceMapResultHealthCheckNodePorts drives both families'
// maps through the changes that move a health-check node port and checks
// that each result says what the port of every updated Service is now, and
// that applying the results one after the other gives what
// HealthCheckNodePorts computes from the whole map; and that each result's
// Ports names every updated Service's ports in the map.
func TestUpdateServiceMapResultHealthCheckNodePorts(t *testing.T) {
	nsn := func(n string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: n} }
	lb := func(policy v1.ServiceExternalTrafficPolicy, hc int32) func(*v1.Service) {
		return func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.ExternalTrafficPolicy = policy
			s.Spec.HealthCheckNodePort = hc
		}
	}
	local := v1.ServiceExternalTrafficPolicyLocal
	cluster := v1.ServiceExternalTrafficPolicyCluster
	dualStack := withClusterIPs("10.96.0.20", "fd00::20")
	twoPorts := withPorts(svcPort("a", 80, v1.ProtocolTCP), svcPort("b", 81, v1.ProtocolUDP))

	web := makeService("ns", "web", dualStack, twoPorts, lb(local, 30001))
	webMoved := makeService("ns", "web", dualStack, twoPorts, lb(local, 30003))
	webRenumbered := makeService("ns", "web", dualStack, withPorts(svcPort("a", 8080, v1.ProtocolTCP), svcPort("b", 81, v1.ProtocolUDP)), lb(local, 30003))
	webCluster := makeService("ns", "web", dualStack, withPorts(svcPort("a", 8080, v1.ProtocolTCP), svcPort("b", 81, v1.ProtocolUDP)), lb(cluster, 0))
	webHeadless := makeService("ns", "web", withClusterIPs("None"), twoPorts, lb(local, 30001))
	api := makeService("ns", "api", lb(cluster, 0))
	apiLocal := makeService("ns", "api", lb(local, 30004))
	apiBad := makeService("ns", "api", lb(local, 70000))
	v6 := makeService("ns", "v6", withClusterIPs("fd00::30"), lb(local, 30002))

	type want map[types.NamespacedName]uint16
	rounds := []struct {
		name   string
		events []svcEvent
		// IPv4 and IPv6 results.
		want4, want6 want
	}{
		{"adds", []svcEvent{{nil, web}, {nil, api}, {nil, v6}},
			want{nsn("web"): 30001, nsn("api"): 0}, want{nsn("web"): 30001, nsn("v6"): 30002}},
		{"health-check node port changes", []svcEvent{{web, webMoved}},
			want{nsn("web"): 30003}, want{nsn("web"): 30003}},
		{"service port changes, health check stays", []svcEvent{{webMoved, webRenumbered}},
			want{nsn("web"): 30003}, want{nsn("web"): 30003}},
		{"Local to Cluster", []svcEvent{{webRenumbered, webCluster}},
			want{nsn("web"): 0}, want{nsn("web"): 0}},
		{"Cluster to Local", []svcEvent{{api, apiLocal}, {webCluster, web}},
			want{nsn("api"): 30004, nsn("web"): 30001}, want{nsn("web"): 30001}},
		{"port out of range", []svcEvent{{apiLocal, apiBad}},
			want{nsn("api"): 0}, want{}},
		{"headless and deleted", []svcEvent{{web, webHeadless}, {v6, nil}, {apiBad, nil}},
			want{nsn("web"): 0, nsn("api"): 0}, want{nsn("web"): 0, nsn("v6"): 0}},
		{"nothing", nil, want{}, want{}},
	}
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		tr := NewServiceChangeTracker(family, nil)
		m := ServicePortMap{}
		state := map[types.NamespacedName]uint16{}
		for _, r := range rounds {
			for _, e := range r.events {
				tr.Update(e.prev, e.cur)
			}
			res := m.Update(tr)
			w := r.want4
			if family == v1.IPv6Protocol {
				w = r.want6
			}
			if diff := cmp.Diff(map[types.NamespacedName]uint16(w), res.HealthCheckNodePorts); diff != "" {
				t.Errorf("%s, %s: HealthCheckNodePorts of the result (-want +got):\n%s", family, r.name, diff)
			}
			if err := applyHealthChanges(state, res.HealthCheckNodePorts, res.UpdatedServices); err != nil {
				t.Errorf("%s, %s: %v", family, r.name, err)
			}
			if diff := cmp.Diff(m.HealthCheckNodePorts(), state); diff != "" {
				t.Errorf("%s, %s: the results applied in turn differ from the map's HealthCheckNodePorts (-map +applied):\n%s", family, r.name, diff)
			}
			// Ports names, for every updated Service, what the map holds
			// for it now.
			if len(res.Ports) != len(res.UpdatedServices) {
				t.Errorf("%s, %s: Ports has %d services, UpdatedServices %d", family, r.name, len(res.Ports), len(res.UpdatedServices))
			}
			for nn := range res.UpdatedServices {
				var want []ServicePortName
				for name := range m {
					if name.NamespacedName == nn {
						want = append(want, name)
					}
				}
				slices.SortFunc(want, CompareServicePortNames)
				if diff := cmp.Diff(want, res.Ports[nn]); diff != "" {
					t.Errorf("%s, %s: Ports[%s] (-map +result):\n%s", family, r.name, nn, diff)
				}
			}
			// PortsIn of the result made by hand, without Ports, finds
			// the same in the map.
			byHand := UpdateServiceMapResult{UpdatedServices: res.UpdatedServices}
			if diff := cmp.Diff(res.Ports, byHand.PortsIn(m), nilAsAbsent); diff != "" {
				t.Errorf("%s, %s: PortsIn of a result without Ports (-Ports +PortsIn):\n%s", family, r.name, diff)
			}
		}
	}
}

// nilAsAbsent makes cmp see a map's nil entries as absent ones.
var nilAsAbsent = cmp.Transformer("nilAsAbsent", func(m map[types.NamespacedName][]ServicePortName) map[types.NamespacedName][]ServicePortName {
	out := make(map[types.NamespacedName][]ServicePortName, len(m))
	for k, v := range m {
		if v != nil {
			out[k] = v
		}
	}
	return out
})

// TestMakeServicePortFuncEquality pins what the MakeServicePortFunc godoc
// says about comparing custom ports with reflect.DeepEqual: a func field
// makes every update a change, and a pointer field is compared by pointee.
func TestMakeServicePortFuncEquality(t *testing.T) {
	type withFunc struct {
		*BaseServicePort
		chain func() string
	}
	type withPointer struct {
		*BaseServicePort
		chain *string
	}
	tests := []struct {
		name string
		mk   MakeServicePortFunc
		want bool
	}{{
		name: "func field: never equal, so an identical update is a change",
		mk: func(_ *v1.ServicePort, svc *v1.Service, base *BaseServicePort) ServicePort {
			return &withFunc{BaseServicePort: base, chain: func() string { return svc.Name }}
		},
		want: true,
	}, {
		name: "pointer field: distinct pointers to equal values are equal",
		mk: func(_ *v1.ServicePort, svc *v1.Service, base *BaseServicePort) ServicePort {
			chain := "KUBE-SVC-" + svc.Name
			return &withPointer{BaseServicePort: base, chain: &chain}
		},
		want: false,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewServiceChangeTracker(v1.IPv4Protocol, tt.mk)
			svc := makeService("ns", "a")
			tr.Update(nil, svc)
			ServicePortMap{}.Update(tr)
			relabelled := svc.DeepCopy()
			relabelled.Labels = map[string]string{"team": "b"}
			if got := tr.Update(svc, relabelled); got != tt.want {
				t.Errorf("Update(svc, svc with new labels) pending = %v, want %v", got, tt.want)
			}
		})
	}
}
