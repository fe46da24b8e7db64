package changetracker

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// sliceEvent is one call of EndpointSliceUpdate.
type sliceEvent struct {
	slice  *discoveryv1.EndpointSlice
	remove bool
	want   bool // expected return value
}

func TestEndpointsChangeTracker(t *testing.T) {
	const v4, v6 = discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	http := []port{namedPort("http", 8080, v1.ProtocolTCP)}
	dns := []port{namedPort("dns", 5353, v1.ProtocolUDP), namedPort("dns-tcp", 5353, v1.ProtocolTCP)}
	nsn := func(n string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: n} }

	s1 := makeSlice("ns", "a", "a-1", v4, http, readyEP("10.0.0.2", "node-b"), readyEP("10.0.0.1", "node-a"))
	s1Reordered := makeSlice("ns", "a", "a-1", v4, http, readyEP("10.0.0.1", "node-a"), readyEP("10.0.0.2", "node-b"))
	s1Annotated := s1.DeepCopy()
	s1Annotated.Annotations = map[string]string{"unrelated": "x"}
	s1Changed := makeSlice("ns", "a", "a-1", v4, http, readyEP("10.0.0.1", "node-a"), terminatingEP("10.0.0.2", "node-b", true))
	s2 := makeSlice("ns", "a", "a-2", v4, http, readyEP("10.0.0.3", "node-b"), readyEP("10.0.0.1", "node-b"))
	// The endpoint 10.0.0.2 moves from a-1 to a-2.
	s1Moved := makeSlice("ns", "a", "a-1", v4, http, readyEP("10.0.0.1", "node-a"))
	s2Moved := makeSlice("ns", "a", "a-2", v4, http, readyEP("10.0.0.2", "node-b"))
	s2Alone := makeSlice("ns", "a", "a-2", v4, http, readyEP("10.0.0.2", "node-b"), readyEP("10.0.0.1", "node-a"))

	udp := makeSlice("ns", "dns", "dns-1", v4, dns, readyEP("10.0.1.1", "node-a"), notReadyEP("10.0.1.2", "node-a"))
	udpFewer := makeSlice("ns", "dns", "dns-1", v4, dns, readyEP("10.0.1.1", "node-a"))
	v6Slice := makeSlice("ns", "a", "a-v6", v6, http, readyEP("fd00::1", "node-a"))
	fqdn := makeSlice("ns", "a", "a-fqdn", discoveryv1.AddressTypeFQDN, http, readyEP("example.com", "node-a"))
	noLabel := makeSlice("ns", "a", "a-nolabel", v4, http, readyEP("10.0.0.9", "node-a"))
	noLabel.Labels = nil

	badStuff := makeSlice("ns", "bad", "bad-1", v4,
		[]port{
			{name: nil, port: ptr.To[int32](80), proto: nil},                              // nil name and protocol: "" and TCP
			{name: ptr.To("noport"), port: nil, proto: ptr.To(v1.ProtocolTCP)},            // skipped
			{name: ptr.To("zero"), port: ptr.To[int32](0), proto: ptr.To(v1.ProtocolTCP)}, // skipped
			{name: nil, port: ptr.To[int32](81), proto: ptr.To(v1.ProtocolTCP)},           // duplicate of the first, skipped
		},
		readyEP("10.0.2.1", "node-a"),
		ep{addr: ""},
		readyEP("10.0.2.300", "node-a"),
		readyEP("fd00::5", "node-a"),
		readyEP("010.000.002.002", ""),
		readyEP("10.0.2.1", "node-b"), // duplicate within a slice, first kept
	)

	type round struct {
		events        []sliceEvent
		wantMap       map[string][]string
		wantUpdated   []types.NamespacedName
		wantConntrack []string
		wantLocal     map[types.NamespacedName]int
	}
	tests := []struct {
		name   string
		family v1.IPFamily
		rounds []round
	}{{
		name:   "add, reorder, unrelated change, real change, delete",
		family: v1.IPv4Protocol,
		rounds: []round{{
			events: []sliceEvent{{slice: s1, want: true}},
			wantMap: map[string][]string{"ns/a:http/TCP": {
				"10.0.0.1:8080 local ready serving node=node-a",
				"10.0.0.2:8080 ready serving node=node-b",
			}},
			wantUpdated: []types.NamespacedName{nsn("a")},
			wantLocal:   map[types.NamespacedName]int{nsn("a"): 1},
		}, {
			events: []sliceEvent{{slice: s1Reordered, want: false}, {slice: s1Annotated, want: false}},
			wantMap: map[string][]string{"ns/a:http/TCP": {
				"10.0.0.1:8080 local ready serving node=node-a",
				"10.0.0.2:8080 ready serving node=node-b",
			}},
			wantLocal: map[types.NamespacedName]int{nsn("a"): 1},
		}, {
			events: []sliceEvent{{slice: s1Changed, want: true}},
			wantMap: map[string][]string{"ns/a:http/TCP": {
				"10.0.0.1:8080 local ready serving node=node-a",
				"10.0.0.2:8080 serving terminating node=node-b",
			}},
			wantUpdated: []types.NamespacedName{nsn("a")},
			wantLocal:   map[types.NamespacedName]int{nsn("a"): 1},
		}, {
			events:      []sliceEvent{{slice: s1Changed, remove: true, want: true}, {slice: s1Changed, remove: true, want: false}},
			wantMap:     map[string][]string{},
			wantUpdated: []types.NamespacedName{nsn("a")},
			wantLocal:   map[types.NamespacedName]int{},
		}},
	}, {
		name:   "two slices merge, duplicates prefer the local copy",
		family: v1.IPv4Protocol,
		rounds: []round{{
			events: []sliceEvent{{slice: s1, want: true}, {slice: s2, want: true}},
			wantMap: map[string][]string{"ns/a:http/TCP": {
				"10.0.0.1:8080 local ready serving node=node-a",
				"10.0.0.2:8080 ready serving node=node-b",
				"10.0.0.3:8080 ready serving node=node-b",
			}},
			wantUpdated: []types.NamespacedName{nsn("a")},
			wantLocal:   map[types.NamespacedName]int{nsn("a"): 1},
		}},
	}, {
		name:   "endpoint moving between slices is no change",
		family: v1.IPv4Protocol,
		rounds: []round{{
			events: []sliceEvent{{slice: s1, want: true}},
			wantMap: map[string][]string{"ns/a:http/TCP": {
				"10.0.0.1:8080 local ready serving node=node-a",
				"10.0.0.2:8080 ready serving node=node-b",
			}},
			wantUpdated: []types.NamespacedName{nsn("a")},
			wantLocal:   map[types.NamespacedName]int{nsn("a"): 1},
		}, {
			events: []sliceEvent{{slice: s2Moved, want: true}, {slice: s1Moved, want: true}},
			wantMap: map[string][]string{"ns/a:http/TCP": {
				"10.0.0.1:8080 local ready serving node=node-a",
				"10.0.0.2:8080 ready serving node=node-b",
			}},
			wantLocal: map[types.NamespacedName]int{nsn("a"): 1},
		}, {
			events: []sliceEvent{{slice: s1Moved, remove: true, want: true}, {slice: s2Alone, want: true}},
			wantMap: map[string][]string{"ns/a:http/TCP": {
				"10.0.0.1:8080 local ready serving node=node-a",
				"10.0.0.2:8080 ready serving node=node-b",
			}},
			wantLocal: map[types.NamespacedName]int{nsn("a"): 1},
		}},
	}, {
		name:   "add then delete before a sync leaves nothing",
		family: v1.IPv4Protocol,
		rounds: []round{{
			events:    []sliceEvent{{slice: s1, want: true}, {slice: s1, remove: true, want: false}},
			wantMap:   map[string][]string{},
			wantLocal: map[types.NamespacedName]int{},
		}},
	}, {
		name:   "UDP changes require conntrack cleanup",
		family: v1.IPv4Protocol,
		rounds: []round{{
			events: []sliceEvent{{slice: udp, want: true}},
			wantMap: map[string][]string{
				"ns/dns:dns/UDP":     {"10.0.1.1:5353 local ready serving node=node-a", "10.0.1.2:5353 local node=node-a"},
				"ns/dns:dns-tcp/TCP": {"10.0.1.1:5353 local ready serving node=node-a", "10.0.1.2:5353 local node=node-a"},
			},
			wantUpdated:   []types.NamespacedName{nsn("dns")},
			wantConntrack: []string{"ns/dns:dns"},
			wantLocal:     map[types.NamespacedName]int{nsn("dns"): 1},
		}, {
			events: []sliceEvent{{slice: udpFewer, want: true}},
			wantMap: map[string][]string{
				"ns/dns:dns/UDP":     {"10.0.1.1:5353 local ready serving node=node-a"},
				"ns/dns:dns-tcp/TCP": {"10.0.1.1:5353 local ready serving node=node-a"},
			},
			wantUpdated:   []types.NamespacedName{nsn("dns")},
			wantConntrack: []string{"ns/dns:dns"},
			wantLocal:     map[types.NamespacedName]int{nsn("dns"): 1},
		}, {
			events:        []sliceEvent{{slice: udpFewer, remove: true, want: true}},
			wantMap:       map[string][]string{},
			wantUpdated:   []types.NamespacedName{nsn("dns")},
			wantConntrack: []string{"ns/dns:dns"},
			wantLocal:     map[types.NamespacedName]int{},
		}},
	}, {
		name:   "ignored slices",
		family: v1.IPv4Protocol,
		rounds: []round{{
			events:    []sliceEvent{{slice: v6Slice, want: false}, {slice: fqdn, want: false}, {slice: noLabel, want: false}, {slice: nil, want: false}},
			wantMap:   map[string][]string{},
			wantLocal: map[types.NamespacedName]int{},
		}},
	}, {
		name:   "IPv6 tracker takes IPv6 slices only",
		family: v1.IPv6Protocol,
		rounds: []round{{
			events:      []sliceEvent{{slice: v6Slice, want: true}, {slice: s1, want: false}},
			wantMap:     map[string][]string{"ns/a:http/TCP": {"[fd00::1]:8080 local ready serving node=node-a"}},
			wantUpdated: []types.NamespacedName{nsn("a")},
			wantLocal:   map[types.NamespacedName]int{nsn("a"): 1},
		}},
	}, {
		name:   "bad ports and endpoints are skipped, the rest kept",
		family: v1.IPv4Protocol,
		rounds: []round{{
			events: []sliceEvent{{slice: badStuff, want: true}},
			wantMap: map[string][]string{"ns/bad/TCP": {
				"10.0.2.1:80 local ready serving node=node-a",
				"10.0.2.2:80 ready serving",
			}},
			wantUpdated: []types.NamespacedName{nsn("bad")},
			wantLocal:   map[types.NamespacedName]int{nsn("bad"): 1},
		}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logger, _ := ktesting.NewTestContext(t)
			tr := NewEndpointsChangeTracker(tc.family, "node-a", nil, WithLogger(logger))
			m := EndpointsMap{}
			for i, r := range tc.rounds {
				for j, e := range r.events {
					if got := tr.EndpointSliceUpdate(e.slice, e.remove); got != e.want {
						t.Errorf("round %d event %d: EndpointSliceUpdate = %v, want %v", i, j, got, e.want)
					}
				}
				res := m.Update(tr)
				if diff := cmp.Diff(r.wantMap, describeEndpointsMap(m)); diff != "" {
					t.Errorf("round %d: map (-want +got):\n%s", i, diff)
				}
				if diff := cmp.Diff(sets.New(r.wantUpdated...), res.UpdatedServices); diff != "" {
					t.Errorf("round %d: UpdatedServices (-want +got):\n%s", i, diff)
				}
				if diff := cmp.Diff(r.wantConntrack, namesOf(res.ConntrackCleanupPorts.UnsortedList())); diff != "" {
					t.Errorf("round %d: ConntrackCleanupPorts (-want +got):\n%s", i, diff)
				}
				if res.ConntrackCleanupRequired != (len(r.wantConntrack) > 0) {
					t.Errorf("round %d: ConntrackCleanupRequired = %v", i, res.ConntrackCleanupRequired)
				}
				if diff := cmp.Diff(r.wantLocal, m.LocalReadyEndpoints()); diff != "" {
					t.Errorf("round %d: LocalReadyEndpoints (-want +got):\n%s", i, diff)
				}
				if n := tr.PendingChanges().Len(); n != 0 {
					t.Errorf("round %d: %d changes still pending after Update", i, n)
				}
			}
		})
	}
}

func TestEndpointHints(t *testing.T) {
	s := makeSlice("ns", "a", "a-1", discoveryv1.AddressTypeIPv4, []port{namedPort("", 80, v1.ProtocolTCP)},
		ep{addr: "10.0.0.1", node: "n1", zone: "z1", zoneHints: []string{"z1"}, nodeHints: []string{"n1"}},
		ep{addr: "10.0.0.2", node: "n2", zone: "z1", zoneHints: []string{"z1"}},
		ep{addr: "10.0.0.3", node: "n3", zone: "z2", zoneHints: []string{"z2", "z3"}},
	)
	tr := NewEndpointsChangeTracker(v1.IPv4Protocol, "n1", nil)
	tr.EndpointSliceUpdate(s, false)
	m := EndpointsMap{}
	m.Update(tr)
	want := map[string][]string{"ns/a/TCP": {
		"10.0.0.1:80 local ready serving node=n1 zone=z1 zoneHints=z1 nodeHints=n1",
		"10.0.0.2:80 ready serving node=n2 zone=z1 zoneHints=z1",
		"10.0.0.3:80 ready serving node=n3 zone=z2 zoneHints=z2,z3",
	}}
	if diff := cmp.Diff(want, describeEndpointsMap(m)); diff != "" {
		t.Errorf("map (-want +got):\n%s", diff)
	}
	// Changing only a hint is a change.
	s2 := s.DeepCopy()
	s2.Endpoints[1].Hints.ForZones[0].Name = "z2"
	if !tr.EndpointSliceUpdate(s2, false) {
		t.Error("a hint change was not recorded")
	}
}

func TestLastChangeTriggerTimes(t *testing.T) {
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakePassiveClock(start)
	tr := NewEndpointsChangeTracker(v1.IPv4Protocol, "node-a", nil, WithClock(clk))
	http := []port{namedPort("http", 80, v1.ProtocolTCP)}
	annotated := func(svc, name, ts, addr string) *discoveryv1.EndpointSlice {
		s := makeSlice("ns", svc, name, discoveryv1.AddressTypeIPv4, http, readyEP(addr, "node-a"))
		s.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: ts}
		return s
	}
	t1 := start.Add(time.Second)
	t2 := start.Add(2 * time.Second)
	tr.EndpointSliceUpdate(annotated("a", "a-1", t1.Format(time.RFC3339Nano), "10.0.0.1"), false)
	tr.EndpointSliceUpdate(annotated("a", "a-1", t2.Format(time.RFC3339Nano), "10.0.0.2"), false)
	tr.EndpointSliceUpdate(annotated("b", "b-1", start.Add(-time.Hour).Format(time.RFC3339Nano), "10.0.0.3"), false) // before start
	tr.EndpointSliceUpdate(annotated("c", "c-1", "yesterday", "10.0.0.4"), false)                                    // unparsable
	tr.EndpointSliceUpdate(annotated("d", "d-1", t1.Format(time.RFC3339Nano), "10.0.0.5"), false)
	tr.EndpointSliceUpdate(annotated("d", "d-1", t2.Format(time.RFC3339Nano), "10.0.0.5"), true) // deletion drops d's times

	m := EndpointsMap{}
	res := m.Update(tr)
	want := map[types.NamespacedName][]time.Time{{Namespace: "ns", Name: "a"}: {t1, t2}}
	if diff := cmp.Diff(want, res.LastChangeTriggerTimes); diff != "" {
		t.Errorf("LastChangeTriggerTimes (-want +got):\n%s", diff)
	}
	res = m.Update(tr)
	if len(res.LastChangeTriggerTimes) != 0 || res.LastChangeTriggerTimes == nil {
		t.Errorf("second Update returned trigger times %v, want an empty map", res.LastChangeTriggerTimes)
	}
}

// weightedEndpoint is a user Endpoint type embedding the base one.
type weightedEndpoint struct {
	*BaseEndpoint
	weight int
}

func TestMakeEndpointFunc(t *testing.T) {
	mk := func(b *BaseEndpoint, name *ServicePortName) Endpoint {
		if b.IP().String() == "10.0.0.2" {
			return nil
		}
		return &weightedEndpoint{BaseEndpoint: b, weight: len(name.Port)}
	}
	tr := NewEndpointsChangeTracker(v1.IPv4Protocol, "node-a", mk)
	tr.EndpointSliceUpdate(makeSlice("ns", "a", "a-1", discoveryv1.AddressTypeIPv4,
		[]port{namedPort("http", 80, v1.ProtocolTCP)},
		readyEP("10.0.0.1", "node-a"), readyEP("10.0.0.2", "node-a")), false)
	m := EndpointsMap{}
	m.Update(tr)
	name := ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "a"}, Port: "http", Protocol: v1.ProtocolTCP}
	eps := m[name]
	if len(eps) != 1 {
		t.Fatalf("got %d endpoints, want 1 (the nil one dropped): %v", len(eps), describeEndpoints(eps))
	}
	if w, ok := eps[0].(*weightedEndpoint); !ok || w.weight != 4 || w.String() != "10.0.0.1:80" {
		t.Errorf("endpoint = %#v, want a weightedEndpoint for 10.0.0.1:80 with weight 4", eps[0])
	}
}

func TestEndpointsMapUpdateNilTracker(t *testing.T) {
	m := EndpointsMap{}
	res := m.Update(nil)
	if res.UpdatedServices == nil || res.ConntrackCleanupPorts == nil || res.LastChangeTriggerTimes == nil || res.LocalReadyEndpoints == nil || len(m) != 0 {
		t.Errorf("Update(nil) = %+v; want empty non-nil results", res)
	}
}

// TestOversizedSlice feeds a slice far beyond the API's limits (thousands of
// endpoints, hundreds of ports, duplicates) next to a normal one: both are
// used, neither blocks the other.
func TestOversizedSlice(t *testing.T) {
	var ports []port
	for i := range 300 {
		ports = append(ports, namedPort(fmt.Sprintf("p%03d", i), int32(1000+i), v1.ProtocolTCP))
	}
	ports = append(ports, namedPort("p000", 9999, v1.ProtocolTCP)) // duplicate name: dropped
	var eps []ep
	for i := range 5000 {
		eps = append(eps, readyEP(fmt.Sprintf("10.%d.%d.%d", 1+i/65536, i/256%256, i%256), "node-b"))
	}
	eps = append(eps, readyEP("10.1.0.0", "node-a")) // duplicate address, local: preferred
	big := makeSlice("ns", "big", "big-1", discoveryv1.AddressTypeIPv4, ports, eps...)
	small := makeSlice("ns", "small", "small-1", discoveryv1.AddressTypeIPv4, []port{namedPort("http", 80, v1.ProtocolTCP)}, readyEP("10.9.0.1", "node-a"))

	tr := NewEndpointsChangeTracker(v1.IPv4Protocol, "node-a", nil)
	if !tr.EndpointSliceUpdate(big, false) || !tr.EndpointSliceUpdate(small, false) {
		t.Fatal("slices not recorded")
	}
	m := EndpointsMap{}
	res := m.Update(tr)
	if res.UpdatedServices.Len() != 2 || len(m) != 301 {
		t.Fatalf("updated %v, %d ports in map; want 2 services and 301 ports", res.UpdatedServices, len(m))
	}
	p0 := ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "big"}, Port: "p000", Protocol: v1.ProtocolTCP}
	if got := m[p0]; len(got) != 5000 || got[0].Port() != 1000 || !got[0].IsLocal() || got[0].String() != "10.1.0.0:1000" {
		t.Errorf("port p000: %d endpoints, first %s (local %v); want 5000, first 10.1.0.0:1000 local", len(got), got[0], got[0].IsLocal())
	}
	if diff := cmp.Diff(map[types.NamespacedName]int{{Namespace: "ns", Name: "big"}: 1, {Namespace: "ns", Name: "small"}: 1}, m.LocalReadyEndpoints()); diff != "" {
		t.Errorf("LocalReadyEndpoints (-want +got):\n%s", diff)
	}
}

// TestUpdateEndpointsMapResultLocalReadyEndpoints drives both families'
// maps through the slice changes that move a Service's count of local
// ready endpoints and checks that each result gives the count of every
// updated Service now, and that applying the results one after the other
// gives what LocalReadyEndpoints computes from the whole map.
func TestUpdateEndpointsMapResultLocalReadyEndpoints(t *testing.T) {
	const v4, v6 = discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	nsn := func(n string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: n} }
	http := []port{namedPort("http", 8080, v1.ProtocolTCP)}
	two := []port{namedPort("http", 8080, v1.ProtocolTCP), namedPort("dns", 53, v1.ProtocolUDP)}

	// One local IP on two ports counts once.
	a1 := makeSlice("ns", "a", "a-1", v4, two, readyEP("10.0.0.1", "node-a"), readyEP("10.0.0.2", "node-b"))
	a1NotReady := makeSlice("ns", "a", "a-1", v4, two, notReadyEP("10.0.0.1", "node-a"), readyEP("10.0.0.2", "node-b"))
	a2 := makeSlice("ns", "a", "a-2", v4, http, readyEP("10.0.0.3", "node-a"), terminatingEP("10.0.0.4", "node-a", true))
	// The same local IP in two slices of the Service counts once.
	a2Dup := makeSlice("ns", "a", "a-2", v4, http, readyEP("10.0.0.1", "node-a"))
	b1 := makeSlice("ns", "b", "b-1", v4, http, readyEP("10.0.1.1", "node-b"))
	b1Local := makeSlice("ns", "b", "b-1", v4, http, readyEP("10.0.1.1", "node-b"), readyEP("10.0.1.2", "node-a"))
	b1Remote := makeSlice("ns", "b", "b-1", v4, http, readyEP("10.0.1.1", "node-b"), readyEP("10.0.1.3", "node-c"))
	a6 := makeSlice("ns", "a", "a-v6", v6, http, readyEP("fd00::1", "node-a"), readyEP("fd00::2", "node-a"))

	type want map[types.NamespacedName]int
	rounds := []struct {
		name         string
		events       []sliceEvent
		want4, want6 want
	}{
		{"adds", []sliceEvent{{slice: a1}, {slice: b1}, {slice: a6}},
			want{nsn("a"): 1, nsn("b"): 0}, want{nsn("a"): 2}},
		{"a second slice, one of its local endpoints terminating", []sliceEvent{{slice: a2}},
			want{nsn("a"): 2}, want{}},
		{"an endpoint comes to this node", []sliceEvent{{slice: b1Local}},
			want{nsn("b"): 1}, want{}},
		{"a local endpoint stops being ready", []sliceEvent{{slice: a1NotReady}},
			want{nsn("a"): 1}, want{}},
		{"the same local address in two slices", []sliceEvent{{slice: a1}, {slice: a2Dup}},
			want{nsn("a"): 1}, want{}},
		{"the last local endpoint goes elsewhere", []sliceEvent{{slice: b1Remote}},
			want{nsn("b"): 0}, want{}},
		{"deletes", []sliceEvent{{slice: a1, remove: true}, {slice: a2Dup, remove: true}, {slice: a6, remove: true}},
			want{nsn("a"): 0}, want{nsn("a"): 0}},
		{"nothing", nil, want{}, want{}},
	}
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		tr := NewEndpointsChangeTracker(family, "node-a", nil)
		m := EndpointsMap{}
		state := map[types.NamespacedName]int{}
		for _, r := range rounds {
			for _, e := range r.events {
				tr.EndpointSliceUpdate(e.slice, e.remove)
			}
			res := m.Update(tr)
			w := r.want4
			if family == v1.IPv6Protocol {
				w = r.want6
			}
			if diff := cmp.Diff(map[types.NamespacedName]int(w), res.LocalReadyEndpoints); diff != "" {
				t.Errorf("%s, %s: LocalReadyEndpoints of the result (-want +got):\n%s", family, r.name, diff)
			}
			if err := applyHealthChanges(state, res.LocalReadyEndpoints, res.UpdatedServices); err != nil {
				t.Errorf("%s, %s: %v", family, r.name, err)
			}
			if diff := cmp.Diff(m.LocalReadyEndpoints(), state); diff != "" {
				t.Errorf("%s, %s: the results applied in turn differ from the map's LocalReadyEndpoints (-map +applied):\n%s", family, r.name, diff)
			}
		}
	}
}

// TestDuplicateAddressPrefersNotTerminating covers a pod IP reused while
// the old pod is still terminating: the address is listed twice, for the
// old pod (terminating) and the new one (ready), in one slice or in two.
// The ready copy must be kept whichever comes first.
func TestDuplicateAddressPrefersNotTerminating(t *testing.T) {
	const v4, v6 = discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	http := []port{namedPort("http", 8080, v1.ProtocolTCP)}
	two := []port{namedPort("http", 8080, v1.ProtocolTCP), namedPort("dns", 53, v1.ProtocolUDP)}
	old := terminatingEP("10.0.0.1", "node-b", false)
	oldServing := terminatingEP("10.0.0.1", "node-b", true)
	oldLocal := terminatingEP("10.0.0.1", "node-a", true)
	renewed := readyEP("10.0.0.1", "node-c")
	other := readyEP("10.0.0.2", "node-b")
	const (
		wantReady = "10.0.0.1:8080 ready serving node=node-c"
		wantOther = "10.0.0.2:8080 ready serving node=node-b"
	)
	tests := []struct {
		name   string
		family v1.IPFamily
		slices []*discoveryv1.EndpointSlice // added in this order
		want   map[string][]string
	}{{
		name:   "two slices, terminating copy first",
		family: v1.IPv4Protocol,
		slices: []*discoveryv1.EndpointSlice{
			makeSlice("ns", "a", "a-1", v4, http, old, other),
			makeSlice("ns", "a", "a-2", v4, http, renewed),
		},
		want: map[string][]string{"ns/a:http/TCP": {wantReady, wantOther}},
	}, {
		name:   "two slices, ready copy first",
		family: v1.IPv4Protocol,
		slices: []*discoveryv1.EndpointSlice{
			makeSlice("ns", "a", "a-2", v4, http, renewed),
			makeSlice("ns", "a", "a-1", v4, http, old, other),
		},
		want: map[string][]string{"ns/a:http/TCP": {wantReady, wantOther}},
	}, {
		name:   "two slices, the terminating copy serving and first",
		family: v1.IPv4Protocol,
		slices: []*discoveryv1.EndpointSlice{
			makeSlice("ns", "a", "a-1", v4, http, oldServing),
			makeSlice("ns", "a", "a-2", v4, http, renewed),
		},
		want: map[string][]string{"ns/a:http/TCP": {wantReady}},
	}, {
		name:   "two slices, the terminating copy local and first",
		family: v1.IPv4Protocol,
		slices: []*discoveryv1.EndpointSlice{
			makeSlice("ns", "a", "a-1", v4, http, oldLocal),
			makeSlice("ns", "a", "a-2", v4, http, renewed),
		},
		want: map[string][]string{"ns/a:http/TCP": {wantReady}},
	}, {
		name:   "two slices, the terminating copy local and last",
		family: v1.IPv4Protocol,
		slices: []*discoveryv1.EndpointSlice{
			makeSlice("ns", "a", "a-2", v4, http, renewed),
			makeSlice("ns", "a", "a-1", v4, http, oldLocal),
		},
		want: map[string][]string{"ns/a:http/TCP": {wantReady}},
	}, {
		name:   "one slice, terminating copy first",
		family: v1.IPv4Protocol,
		slices: []*discoveryv1.EndpointSlice{makeSlice("ns", "a", "a-1", v4, http, old, other, renewed)},
		want:   map[string][]string{"ns/a:http/TCP": {wantReady, wantOther}},
	}, {
		name:   "one slice, ready copy first",
		family: v1.IPv4Protocol,
		slices: []*discoveryv1.EndpointSlice{makeSlice("ns", "a", "a-1", v4, http, renewed, other, old)},
		want:   map[string][]string{"ns/a:http/TCP": {wantReady, wantOther}},
	}, {
		name:   "two ports, terminating copy first",
		family: v1.IPv4Protocol,
		slices: []*discoveryv1.EndpointSlice{
			makeSlice("ns", "a", "a-1", v4, two, old),
			makeSlice("ns", "a", "a-2", v4, two, renewed),
		},
		want: map[string][]string{
			"ns/a:http/TCP": {wantReady},
			"ns/a:dns/UDP":  {"10.0.0.1:53 ready serving node=node-c"},
		},
	}, {
		name:   "IPv6, terminating copy first",
		family: v1.IPv6Protocol,
		slices: []*discoveryv1.EndpointSlice{
			makeSlice("ns", "a", "a-1", v6, http, terminatingEP("fd00::1", "node-b", true)),
			makeSlice("ns", "a", "a-2", v6, http, readyEP("fd00::1", "node-c")),
		},
		want: map[string][]string{"ns/a:http/TCP": {"[fd00::1]:8080 ready serving node=node-c"}},
	}, {
		name:   "only terminating copies: the first stays",
		family: v1.IPv4Protocol,
		slices: []*discoveryv1.EndpointSlice{
			makeSlice("ns", "a", "a-1", v4, http, old),
			makeSlice("ns", "a", "a-2", v4, http, oldServing),
		},
		want: map[string][]string{"ns/a:http/TCP": {"10.0.0.1:8080 terminating node=node-b"}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			logger, _ := ktesting.NewTestContext(t)
			tr := NewEndpointsChangeTracker(tc.family, "node-a", nil, WithLogger(logger))
			m := EndpointsMap{}
			for _, s := range tc.slices {
				tr.EndpointSliceUpdate(s, false)
			}
			m.Update(tr)
			if diff := cmp.Diff(tc.want, describeEndpointsMap(m)); diff != "" {
				t.Errorf("map (-want +got):\n%s", diff)
			}
		})
	}
}

// TestConsecutiveChangesOfOnePort checks that each Update compares a
// one-port, one-slice Service's new endpoints with those of the Update
// before, change after change: the tracker builds such a port list in one
// of two places in turn, and a list built over the previous one would
// hide the change (no conntrack cleanup for the UDP port) or invent one.
func TestConsecutiveChangesOfOnePort(t *testing.T) {
	udp := []port{namedPort("dns", 53, v1.ProtocolUDP)}
	name := ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "dns"}, Port: "dns", Protocol: v1.ProtocolUDP}
	tracker := NewEndpointsChangeTracker(v1.IPv4Protocol, "node-1", nil)
	m := EndpointsMap{}
	for i, step := range []struct {
		eps       []ep
		wantClean bool
	}{
		{eps: []ep{readyEP("10.0.0.1", "node-1")}, wantClean: true},
		{eps: []ep{readyEP("10.0.0.1", "node-1"), readyEP("10.0.0.2", "node-2")}, wantClean: true},
		{eps: []ep{readyEP("10.0.0.2", "node-2")}, wantClean: true},
		// A change of the slice that leaves the endpoints as they are.
		{eps: []ep{readyEP("10.0.0.2", "node-2"), {}}, wantClean: false},
		{eps: []ep{readyEP("10.0.0.3", "node-2")}, wantClean: true},
		{eps: []ep{readyEP("10.0.0.3", "node-2"), notReadyEP("10.0.0.4", "node-1")}, wantClean: true},
		{eps: []ep{readyEP("10.0.0.3", "node-2")}, wantClean: true},
	} {
		tracker.EndpointSliceUpdate(makeSlice("ns", "dns", "dns-1", discoveryv1.AddressTypeIPv4, udp, step.eps...), false)
		res := m.Update(tracker)
		if got := res.ConntrackCleanupPorts.Has(name); got != step.wantClean {
			t.Errorf("step %d: conntrack cleanup of %v = %v, want %v", i, name, got, step.wantClean)
		}
		var want, got []string
		for _, e := range step.eps {
			if e.addr != "" {
				want = append(want, e.addr+":53")
			}
		}
		for _, e := range m[name] {
			got = append(got, e.String())
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("step %d: endpoints (-want +got):\n%s", i, diff)
		}
	}
}
