package changetracker

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
)

func TestCategorizeEndpoints(t *testing.T) {
	type epSpec struct {
		ip                          string
		local, ready, serving, term bool
		zoneHints, nodeHints        []string
	}
	mk := func(specs ...epSpec) []Endpoint {
		var out []Endpoint
		for _, s := range specs {
			info := EndpointInfo{IP: netip.MustParseAddr(s.ip), Port: 80, IsLocal: s.local, Ready: s.ready, Serving: s.serving, Terminating: s.term}
			if s.zoneHints != nil {
				info.ZoneHints = sets.New(s.zoneHints...)
			}
			if s.nodeHints != nil {
				info.NodeHints = sets.New(s.nodeHints...)
			}
			out = append(out, NewBaseEndpoint(info))
		}
		return out
	}
	ready := func(ip string, local bool, zones ...string) epSpec {
		return epSpec{ip: ip, local: local, ready: true, serving: true, zoneHints: zones}
	}
	nodeHinted := func(ip string, local bool, nodes []string, zones ...string) epSpec {
		return epSpec{ip: ip, local: local, ready: true, serving: true, nodeHints: nodes, zoneHints: zones}
	}
	terminating := func(ip string, local, serving bool) epSpec {
		return epSpec{ip: ip, local: local, serving: serving, term: true}
	}
	clusterSvc := &BaseServicePort{}
	localSvc := &BaseServicePort{internalPolicyLocal: true}
	externalLocalSvc := &BaseServicePort{externalPolicyLocal: true, nodePort: 30000}
	bothLocalSvc := &BaseServicePort{internalPolicyLocal: true, externalPolicyLocal: true, nodePort: 30000}
	zoneA := map[string]string{v1.LabelTopologyZone: "zone-a"}

	tests := []struct {
		name        string
		svc         ServicePort
		nodeLabels  map[string]string
		endpoints   []Endpoint
		wantCluster []string
		wantLocal   []string
		wantAll     []string
		wantAny     bool
	}{{
		name:      "no endpoints",
		svc:       clusterSvc,
		endpoints: nil,
	}, {
		name:        "no hints: all ready endpoints",
		svc:         clusterSvc,
		nodeLabels:  zoneA,
		endpoints:   mk(ready("10.0.0.1", false), ready("10.0.0.2", true), epSpec{ip: "10.0.0.3"}),
		wantCluster: []string{"10.0.0.1:80", "10.0.0.2:80"},
		wantAll:     []string{"10.0.0.1:80", "10.0.0.2:80"},
		wantAny:     true,
	}, {
		name:        "zone hints for this zone",
		svc:         clusterSvc,
		nodeLabels:  zoneA,
		endpoints:   mk(ready("10.0.0.1", false, "zone-a"), ready("10.0.0.2", false, "zone-b"), ready("10.0.0.3", false, "zone-a", "zone-c")),
		wantCluster: []string{"10.0.0.1:80", "10.0.0.3:80"},
		wantAll:     []string{"10.0.0.1:80", "10.0.0.3:80"},
		wantAny:     true,
	}, {
		name:        "one ready endpoint without zone hint disables hints",
		svc:         clusterSvc,
		nodeLabels:  zoneA,
		endpoints:   mk(ready("10.0.0.1", false, "zone-a"), ready("10.0.0.2", false)),
		wantCluster: []string{"10.0.0.1:80", "10.0.0.2:80"},
		wantAll:     []string{"10.0.0.1:80", "10.0.0.2:80"},
		wantAny:     true,
	}, {
		name:       "a not-ready endpoint without hints does not disable them",
		svc:        clusterSvc,
		nodeLabels: zoneA,
		endpoints: mk(ready("10.0.0.1", false, "zone-a"), ready("10.0.0.2", false, "zone-b"),
			epSpec{ip: "10.0.0.3"}),
		wantCluster: []string{"10.0.0.1:80"},
		wantAll:     []string{"10.0.0.1:80"},
		wantAny:     true,
	}, {
		name:        "no endpoint hinted for this zone: all",
		svc:         clusterSvc,
		nodeLabels:  zoneA,
		endpoints:   mk(ready("10.0.0.1", false, "zone-b"), ready("10.0.0.2", false, "zone-c")),
		wantCluster: []string{"10.0.0.1:80", "10.0.0.2:80"},
		wantAll:     []string{"10.0.0.1:80", "10.0.0.2:80"},
		wantAny:     true,
	}, {
		name:        "node without zone label: all",
		svc:         clusterSvc,
		nodeLabels:  nil,
		endpoints:   mk(ready("10.0.0.1", false, "zone-a"), ready("10.0.0.2", false, "zone-b")),
		wantCluster: []string{"10.0.0.1:80", "10.0.0.2:80"},
		wantAll:     []string{"10.0.0.1:80", "10.0.0.2:80"},
		wantAny:     true,
	}, {
		name:       "node hints for this node win over zone hints",
		svc:        clusterSvc,
		nodeLabels: zoneA,
		endpoints: mk(nodeHinted("10.0.0.1", true, []string{"node-1"}, "zone-a"),
			nodeHinted("10.0.0.2", false, []string{"node-2"}, "zone-a")),
		wantCluster: []string{"10.0.0.1:80"},
		wantAll:     []string{"10.0.0.1:80"},
		wantAny:     true,
	}, {
		name:       "node hints but none for this node: zone hints",
		svc:        clusterSvc,
		nodeLabels: zoneA,
		endpoints: mk(nodeHinted("10.0.0.1", false, []string{"node-3"}, "zone-a"),
			nodeHinted("10.0.0.2", false, []string{"node-2"}, "zone-b")),
		wantCluster: []string{"10.0.0.1:80"},
		wantAll:     []string{"10.0.0.1:80"},
		wantAny:     true,
	}, {
		name:       "node hints missing on one endpoint: zone hints",
		svc:        clusterSvc,
		nodeLabels: zoneA,
		endpoints: mk(nodeHinted("10.0.0.1", true, []string{"node-1"}, "zone-a"),
			ready("10.0.0.2", false, "zone-a"), ready("10.0.0.3", false, "zone-b")),
		wantCluster: []string{"10.0.0.1:80", "10.0.0.2:80"},
		wantAll:     []string{"10.0.0.1:80", "10.0.0.2:80"},
		wantAny:     true,
	}, {
		name: "no ready endpoints: serving terminating ones",
		svc:  clusterSvc,
		endpoints: mk(terminating("10.0.0.1", false, true), terminating("10.0.0.2", false, false),
			epSpec{ip: "10.0.0.3"}),
		wantCluster: []string{"10.0.0.1:80"},
		wantAll:     []string{"10.0.0.1:80"},
		wantAny:     true,
	}, {
		name:      "nothing serving",
		svc:       clusterSvc,
		endpoints: mk(terminating("10.0.0.1", false, false), epSpec{ip: "10.0.0.3"}),
	}, {
		name:      "internal Local: local ready only",
		svc:       localSvc,
		endpoints: mk(ready("10.0.0.1", false), ready("10.0.0.2", true), terminating("10.0.0.3", true, true)),
		wantLocal: []string{"10.0.0.2:80"},
		wantAll:   []string{"10.0.0.2:80"},
		wantAny:   true,
	}, {
		name:      "internal Local with no local endpoints still has endpoints somewhere",
		svc:       localSvc,
		endpoints: mk(ready("10.0.0.1", false)),
		wantAny:   true,
	}, {
		name:      "internal Local falls back to local serving terminating",
		svc:       localSvc,
		endpoints: mk(ready("10.0.0.1", false), terminating("10.0.0.2", true, true), terminating("10.0.0.3", true, false)),
		wantLocal: []string{"10.0.0.2:80"},
		wantAll:   []string{"10.0.0.2:80"},
		wantAny:   true,
	}, {
		name:        "external Local: cluster for internal traffic, local for external",
		svc:         externalLocalSvc,
		endpoints:   mk(ready("10.0.0.1", false), ready("10.0.0.2", true)),
		wantCluster: []string{"10.0.0.1:80", "10.0.0.2:80"},
		wantLocal:   []string{"10.0.0.2:80"},
		wantAll:     []string{"10.0.0.1:80", "10.0.0.2:80"},
		wantAny:     true,
	}, {
		name:        "external Local with local terminating only: union",
		svc:         externalLocalSvc,
		endpoints:   mk(ready("10.0.0.1", false), terminating("10.0.0.2", true, true)),
		wantCluster: []string{"10.0.0.1:80"},
		wantLocal:   []string{"10.0.0.2:80"},
		wantAll:     []string{"10.0.0.1:80", "10.0.0.2:80"},
		wantAny:     true,
	}, {
		name:       "external Local with zone hints excluding the local endpoint: union",
		svc:        externalLocalSvc,
		nodeLabels: zoneA,
		endpoints: mk(ready("10.0.0.1", false, "zone-a"), ready("10.0.0.2", true, "zone-b"),
			ready("10.0.0.3", false, "zone-b")),
		wantCluster: []string{"10.0.0.1:80"},
		wantLocal:   []string{"10.0.0.2:80"},
		wantAll:     []string{"10.0.0.1:80", "10.0.0.2:80"},
		wantAny:     true,
	}, {
		name:        "both policies Local but externally accessible",
		svc:         bothLocalSvc,
		endpoints:   mk(ready("10.0.0.1", false), ready("10.0.0.2", true)),
		wantCluster: []string{"10.0.0.1:80", "10.0.0.2:80"},
		wantLocal:   []string{"10.0.0.2:80"},
		wantAll:     []string{"10.0.0.1:80", "10.0.0.2:80"},
		wantAny:     true,
	}, {
		name:      "nil service",
		svc:       nil,
		endpoints: mk(ready("10.0.0.1", false)),
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]Endpoint(nil), tc.endpoints...)
			cluster, local, all, anyEP := CategorizeEndpoints(tc.endpoints, tc.svc, "node-1", tc.nodeLabels)
			if diff := cmp.Diff(tc.wantCluster, describeEndpoints(cluster)); diff != "" {
				t.Errorf("cluster (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantLocal, describeEndpoints(local)); diff != "" {
				t.Errorf("local (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantAll, describeEndpoints(all)); diff != "" {
				t.Errorf("all reachable (-want +got):\n%s", diff)
			}
			if anyEP != tc.wantAny {
				t.Errorf("hasAnyEndpoints = %v, want %v", anyEP, tc.wantAny)
			}
			if diff := cmp.Diff(describeEndpoints(in), describeEndpoints(tc.endpoints)); diff != "" {
				t.Errorf("input modified (-before +after):\n%s", diff)
			}
		})
	}
}

func TestClusterTopology(t *testing.T) {
	ep := func(ip string, ready bool, zones, nodes []string) Endpoint {
		info := EndpointInfo{IP: netip.MustParseAddr(ip), Port: 80, Ready: ready, Serving: ready}
		if zones != nil {
			info.ZoneHints = sets.New(zones...)
		}
		if nodes != nil {
			info.NodeHints = sets.New(nodes...)
		}
		return NewBaseEndpoint(info)
	}
	zoneA := map[string]string{v1.LabelTopologyZone: "zone-a"}
	tests := []struct {
		name      string
		endpoints []Endpoint
		labels    map[string]string
		want      string
	}{
		{"no endpoints", nil, zoneA, ""},
		{"no hints", []Endpoint{ep("10.0.0.1", true, nil, nil)}, zoneA, ""},
		{"zone hints for this zone", []Endpoint{ep("10.0.0.1", true, []string{"zone-a"}, nil), ep("10.0.0.2", true, []string{"zone-b"}, nil)}, zoneA, v1.ServiceTrafficDistributionPreferSameZone},
		{"zone hints, node without a zone", []Endpoint{ep("10.0.0.1", true, []string{"zone-a"}, nil)}, nil, ""},
		{"zone hints for other zones only", []Endpoint{ep("10.0.0.1", true, []string{"zone-b"}, nil)}, zoneA, ""},
		{"one ready endpoint without a hint", []Endpoint{ep("10.0.0.1", true, []string{"zone-a"}, nil), ep("10.0.0.2", true, nil, nil)}, zoneA, ""},
		{"unready endpoint without a hint does not count", []Endpoint{ep("10.0.0.1", true, []string{"zone-a"}, nil), ep("10.0.0.2", false, nil, nil)}, zoneA, v1.ServiceTrafficDistributionPreferSameZone},
		{"node hints win over zone hints", []Endpoint{ep("10.0.0.1", true, []string{"zone-a"}, []string{"node-1"}), ep("10.0.0.2", true, []string{"zone-a"}, []string{"node-2"})}, zoneA, v1.ServiceTrafficDistributionPreferSameNode},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ClusterTopology(tt.endpoints, "node-1", tt.labels); got != tt.want {
				t.Errorf("ClusterTopology() = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestCategorizeEndpointsSharesKeptList checks that a port whose endpoints
// are all kept gets the map's list itself, without a copy, capped so that
// appending to a result cannot write into that list; and that a list
// with an endpoint left out is still a copy.
func TestCategorizeEndpointsSharesKeptList(t *testing.T) {
	mk := func(ready ...bool) []Endpoint {
		out := make([]Endpoint, 0, len(ready)+4) // room an append could misuse
		for i, r := range ready {
			out = append(out, NewBaseEndpoint(EndpointInfo{IP: netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}), Port: 80, Ready: r, Serving: r}))
		}
		return out
	}
	allReady := mk(true, true, true)
	svc := &BaseServicePort{}
	if allocs := testing.AllocsPerRun(20, func() {
		CategorizeEndpoints(allReady, svc, "node-1", nil)
	}); allocs != 0 {
		t.Errorf("all endpoints ready: %.0f allocations, want 0", allocs)
	}
	cluster, _, all, _ := CategorizeEndpoints(allReady, svc, "node-1", nil)
	if len(cluster) != 3 || &cluster[0] != &allReady[0] || &all[0] != &allReady[0] {
		t.Errorf("all endpoints ready: cluster %v is not the input list", describeEndpoints(cluster))
	}
	if cap(cluster) != len(cluster) {
		t.Errorf("cap(cluster) = %d, want %d: an append would write into the input's array", cap(cluster), len(cluster))
	}

	oneNotReady := mk(true, false, true)
	cluster, _, _, _ = CategorizeEndpoints(oneNotReady, svc, "node-1", nil)
	if diff := cmp.Diff([]string{"10.0.0.1:80", "10.0.0.3:80"}, describeEndpoints(cluster)); diff != "" {
		t.Errorf("one endpoint not ready: cluster (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"}, describeEndpoints(oneNotReady)); diff != "" {
		t.Errorf("one endpoint not ready: input modified (-want +got):\n%s", diff)
	}
}
