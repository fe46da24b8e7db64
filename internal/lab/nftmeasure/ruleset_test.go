package nftmeasure

import (
	"context"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"
)

// TestFullLoadObjectCounts loads the generated rulesets into knftables' Fake
// (which checks every chain and map a rule or element names) and checks the
// property the layouts exist for: SharedMap's maps do not grow with the
// services, KubeProxyLike has an anonymous map in every service chain.
func TestFullLoadObjectCounts(t *testing.T) {
	for _, tc := range []struct {
		layout   Layout
		services int
		wantMaps []string
		wantAnon int
	}{
		{SharedMap, 10, []string{EndpointsMap, ServiceIPsMap}, 0},
		{SharedMap, 200, []string{EndpointsMap, ServiceIPsMap}, 0},
		{NumgenCascade, 10, []string{ServiceIPsMap}, 0},
		{NumgenCascade, 200, []string{ServiceIPsMap}, 0},
		{KubeProxyLike, 10, []string{ServiceIPsMap}, 10},
		{KubeProxyLike, 200, []string{ServiceIPsMap}, 200},
	} {
		t.Run(string(tc.layout), func(t *testing.T) {
			ctx := context.Background()
			svcs, err := Cluster(tc.services, 10)
			if err != nil {
				t.Fatal(err)
			}
			fake := load(t, tc.layout, svcs)
			maps, err := fake.List(ctx, "map")
			if err != nil {
				t.Fatal(err)
			}
			sort.Strings(maps)
			if diff := cmp.Diff(tc.wantMaps, maps); diff != "" {
				t.Errorf("maps (-want +got):\n%s", diff)
			}
			anon := strings.Count(fake.Dump(), "vmap {")
			if anon != tc.wantAnon {
				t.Errorf("%d anonymous verdict maps, want %d", anon, tc.wantAnon)
			}
			chains, err := fake.List(ctx, "chain")
			if err != nil {
				t.Fatal(err)
			}
			// services + 2 base chains + per service 1 + 10 endpoint chains.
			if want := 3 + tc.services*11; len(chains) != want {
				t.Errorf("%d chains, want %d", len(chains), want)
			}
			elems, err := fake.ListElements(ctx, "map", ServiceIPsMap)
			if err != nil {
				t.Fatal(err)
			}
			if len(elems) != tc.services {
				t.Errorf("%d elements of %s, want %d", len(elems), ServiceIPsMap, tc.services)
			}
		})
	}
}

// TestChangesApplyToFake checks that the partial-sync changes are valid on
// top of a loaded table (the Fake refuses a flush of a missing chain, a
// delete of a missing element, a rule in a missing chain) and do what they
// say.
func TestChangesApplyToFake(t *testing.T) {
	ctx := context.Background()
	svcs, err := Cluster(20, 10)
	if err != nil {
		t.Fatal(err)
	}
	fake := load(t, SharedMap, svcs)
	svc := svcs[7]
	to := svc.Endpoints[0]
	apply := func(c Change) {
		t.Helper()
		tx := fake.NewTransaction()
		if err := c.Transaction(tx); err != nil {
			t.Fatal(err)
		}
		if err := fake.Run(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	apply(DeleteServiceIP(svc))
	if elems, _ := fake.ListElements(ctx, "map", ServiceIPsMap); len(elems) != 19 {
		t.Errorf("after delete: %d elements, want 19", len(elems))
	}
	tx := fake.NewTransaction()
	_ = DeleteServiceIP(svc).Transaction(tx)
	if err := fake.Run(ctx, tx); !knftables.IsNotFound(err) {
		t.Errorf("deleting a missing element: got %v, want not found", err)
	}
	apply(AddServiceIP(svc))
	apply(ReplaceEndpoint(svc, 0, netip.MustParseAddrPort("10.9.9.9:9090"), "endpoint-new"))
	rules, err := fake.ListRules(ctx, EndpointChain(svc, 0))
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != 1 {
		t.Fatalf("%d rules in the replaced chain, want 1", len(rules))
	}
	dump := fake.Dump()
	for _, want := range []string{
		"add rule ip proxykit " + EndpointChain(svc, 0) + " meta l4proto tcp dnat to 10.9.9.9:9090",
		"add rule ip proxykit endpoint-new meta l4proto tcp dnat to 10.9.9.9:9090",
	} {
		if !strings.Contains(dump, want) {
			t.Errorf("dump lacks %q", want)
		}
	}
	if strings.Contains(dump, EndpointChain(svc, 0)+" meta l4proto tcp dnat to "+to.String()) {
		t.Errorf("the flushed chain still has its old rule")
	}
}

// TestNumgenCascade checks that a cascade service chain picks each of its
// endpoints with probability 1/N: rule j matches 1 in N-j of the packets
// that reach it, and the last rule takes the rest.
func TestNumgenCascade(t *testing.T) {
	svcs, err := Cluster(1, 3)
	if err != nil {
		t.Fatal(err)
	}
	fake := load(t, NumgenCascade, svcs)
	rules, err := fake.ListRules(context.Background(), ServiceChain(svcs[0]))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rules {
		got = append(got, r.Rule)
	}
	want := []string{
		"numgen random mod 3 0 goto " + EndpointChain(svcs[0], 0),
		"numgen random mod 2 0 goto " + EndpointChain(svcs[0], 1),
		"goto " + EndpointChain(svcs[0], 2),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("service chain (-want +got):\n%s", diff)
	}
}

func TestClusterRefuses(t *testing.T) {
	for _, tc := range []struct{ n, per int }{{10, 0}, {10, MaxEndpoints + 1}, {-1, 10}, {1 << 17, 1}} {
		if _, err := Cluster(tc.n, tc.per); err == nil {
			t.Errorf("Cluster(%d, %d): no error", tc.n, tc.per)
		}
	}
	if _, err := FullLoad("nope", nil); err == nil {
		t.Error("FullLoad of an unknown layout: no error")
	}
	if err := (Change{{"replace", &knftables.Chain{Name: "x"}}}).Transaction(knftables.NewFake(Family, Table).NewTransaction()); err == nil {
		t.Error("unknown verb: no error")
	}
}

func load(t *testing.T, layout Layout, svcs []Service) *knftables.Fake {
	t.Helper()
	fake := knftables.NewFake(Family, Table)
	c, err := FullLoad(layout, svcs)
	if err != nil {
		t.Fatal(err)
	}
	tx := fake.NewTransaction()
	if err := c.Transaction(tx); err != nil {
		t.Fatal(err)
	}
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatalf("loading %s: %v", layout, err)
	}
	return fake
}

// TestDataMapOnFake loads the DataMap layout into knftables' Fake and
// checks that its objects do not grow with the services (only elements
// do), and that the one-endpoint changes leave the elements they promise.
func TestDataMapOnFake(t *testing.T) {
	ctx := context.Background()
	var chains10 []string
	for _, size := range []int{10, 200} {
		svcs, err := Cluster(size, 10)
		if err != nil {
			t.Fatal(err)
		}
		fake := load(t, DataMap, svcs)
		chains, err := fake.List(ctx, "chain")
		if err != nil {
			t.Fatal(err)
		}
		sort.Strings(chains)
		if chains10 == nil {
			chains10 = chains
		} else if diff := cmp.Diff(chains10, chains); diff != "" {
			t.Errorf("chains at %d services differ from those at 10 (-10 +%d):\n%s", size, size, diff)
		}
		maps, err := fake.List(ctx, "map")
		if err != nil {
			t.Fatal(err)
		}
		sort.Strings(maps)
		if diff := cmp.Diff([]string{EndpointsDataMap, ServiceIPsMap}, maps); diff != "" {
			t.Errorf("maps at %d services (-want +got):\n%s", size, diff)
		}
		for _, tc := range []struct {
			kind, name string
			want       int
		}{
			{"map", EndpointsDataMap, 10 * size},
			{"map", ServiceIPsMap, size},
			{"set", HairpinSet, (size + LocalEvery - 1) / LocalEvery},
		} {
			elems, err := fake.ListElements(ctx, tc.kind, tc.name)
			if err != nil {
				t.Fatal(err)
			}
			if len(elems) != tc.want {
				t.Errorf("%d services: %d elements of %s, want %d", size, len(elems), tc.name, tc.want)
			}
		}
	}

	svcs, err := Cluster(3, 4)
	if err != nil {
		t.Fatal(err)
	}
	fake := load(t, DataMap, svcs)
	svc := svcs[1]
	for _, c := range []Change{
		DataMapReplaceEndpoint(svc, 2, netip.MustParseAddrPort("10.9.9.9:9090")),
		DataMapRemoveEndpoint(Service{Index: 1, ClusterIP: svc.ClusterIP, Port: 80, Endpoints: []netip.AddrPort{
			svc.Endpoints[0], svc.Endpoints[1], netip.MustParseAddrPort("10.9.9.9:9090"), svc.Endpoints[3],
		}}, 1),
	} {
		tx := fake.NewTransaction()
		if err := c.Transaction(tx); err != nil {
			t.Fatal(err)
		}
		if err := fake.Run(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, line := range strings.Split(fake.Dump(), "\n") {
		if strings.Contains(line, "element") && strings.Contains(line, svc.ClusterIP.String()+" . tcp") {
			got = append(got, line)
		}
	}
	sort.Strings(got)
	want := []string{
		"add element ip proxykit endpoints { 172.30.0.1 . tcp . 80 . 0 : 10.0.0.5 . 8080 }",
		"add element ip proxykit endpoints { 172.30.0.1 . tcp . 80 . 1 : 10.0.0.8 . 8080 }",
		"add element ip proxykit endpoints { 172.30.0.1 . tcp . 80 . 2 : 10.9.9.9 . 9090 }",
		"add element ip proxykit service-ips { 172.30.0.1 . tcp . 80 : goto lb-3 }",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("service 1 after replacing endpoint 2 and removing endpoint 1 (-want +got):\n%s", diff)
	}
}

// TestAffinityReplaceEndpoint checks on the Fake that the affinity
// service's change leaves it as a fresh load of the changed service
// would: the same chains, sets and rules, the old endpoint's gone.
func TestAffinityReplaceEndpoint(t *testing.T) {
	ctx := context.Background()
	svcs, err := Cluster(3, 3)
	if err != nil {
		t.Fatal(err)
	}
	svcs[1].Affinity = time.Hour
	to := netip.MustParseAddrPort("10.9.9.9:9090")
	fake := load(t, DataMap, svcs)
	tx := fake.NewTransaction()
	if err := AffinityReplaceEndpoint(svcs[1], 1, to).Transaction(tx); err != nil {
		t.Fatal(err)
	}
	if err := fake.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	changed := append([]Service(nil), svcs...)
	changed[1].Endpoints = append([]netip.AddrPort(nil), svcs[1].Endpoints...)
	changed[1].Endpoints[1] = to
	want := load(t, DataMap, changed)
	if diff := cmp.Diff(sortedLines(want.Dump()), sortedLines(fake.Dump())); diff != "" {
		t.Errorf("after the change (-fresh load +changed):\n%s", diff)
	}
}

func sortedLines(s string) []string {
	lines := strings.Split(s, "\n")
	sort.Strings(lines)
	return lines
}

// TestDataMapRemoveLastEndpoint checks that a service losing its only
// endpoint leaves ServiceIPsMap for the no-endpoint set, and that an index
// out of range is no change rather than a panic.
func TestDataMapRemoveLastEndpoint(t *testing.T) {
	ctx := context.Background()
	svcs, err := Cluster(2, 1)
	if err != nil {
		t.Fatal(err)
	}
	svcs[1].DropWithoutEndpoints = true
	fake := load(t, DataMap, svcs)
	for _, svc := range svcs {
		if c := DataMapRemoveEndpoint(svc, 1); c != nil {
			t.Errorf("removing endpoint 1 of a 1-endpoint service: %v, want no change", c)
		}
		tx := fake.NewTransaction()
		if err := DataMapRemoveEndpoint(svc, 0).Transaction(tx); err != nil {
			t.Fatal(err)
		}
		if err := fake.Run(ctx, tx); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		kind, name string
		want       []string
	}{
		{"map", ServiceIPsMap, nil},
		{"map", EndpointsDataMap, nil},
		{"set", NoEndpointRejectSet, []string{"172.30.0.0 . tcp . 80"}},
		{"set", NoEndpointDropSet, []string{"172.30.0.1 . tcp . 80"}},
	} {
		elems, err := fake.ListElements(ctx, tc.kind, tc.name)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range elems {
			got = append(got, strings.Join(e.Key, " . "))
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s after removing every endpoint (-want +got):\n%s", tc.name, diff)
		}
	}
}
