package nftmeasure

import (
	"errors"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
)

// dataMapNetwork is a node with four pods on its bridge (all local, so
// their addresses go to HairpinSet; pod-d serves only after a change) and
// a client outside ClusterCIDR.
type dataMapNetwork struct {
	net      *kerneltest.ProxyNetwork
	tab      *nftTable
	pods     map[string]netip.AddrPort
	bridge   netip.Addr
	client   netip.Addr
	allowed  netip.Addr
	services map[string]Service
}

func newDataMapNetwork(t *testing.T) *dataMapNetwork {
	t.Helper()
	const port = 8080
	d := &dataMapNetwork{
		pods:    map[string]netip.AddrPort{},
		bridge:  netip.MustParseAddr("10.1.0.1"),
		client:  netip.MustParseAddr("192.168.0.2"),
		allowed: netip.MustParseAddr("192.168.0.3"),
	}
	cfg := kerneltest.ProxyNetworkConfig{
		ClientAddrs: []netip.Prefix{netip.PrefixFrom(d.client, 24)},
		NodeAddrs:   []netip.Prefix{netip.MustParsePrefix("192.168.0.1/24")},
		BridgeAddrs: []netip.Prefix{netip.PrefixFrom(d.bridge, 24)},
		BackendPort: port,
	}
	for i, name := range []string{"pod-a", "pod-b", "pod-c", "pod-d"} {
		a := netip.AddrFrom4([4]byte{10, 1, 0, byte(2 + i)})
		cfg.Pods = append(cfg.Pods, kerneltest.NetworkPod{Name: name, Addrs: []netip.Prefix{netip.PrefixFrom(a, 24)}})
		d.pods[name] = netip.AddrPortFrom(a, port)
	}
	d.net = kerneltest.NewProxyNetwork(t, cfg)
	d.net.Client.AddAddr(t, d.net.ClientLink, netip.PrefixFrom(d.allowed, 24))
	var nft knftables.Interface
	if err := d.net.Node.Do(func() (err error) {
		nft, err = knftables.New(Family, Table)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	d.tab = &nftTable{ns: d.net.Node, nft: nft}

	svc := func(i int, eps ...string) Service {
		s := Service{Index: i, ClusterIP: netip.AddrFrom4([4]byte{172, 30, 0, byte(i)}), Port: 80}
		for _, ep := range eps {
			s.Endpoints = append(s.Endpoints, d.pods[ep])
			s.Local = append(s.Local, true)
		}
		return s
	}
	d.services = map[string]Service{
		"balanced": svc(0, "pod-a", "pod-b"),
		"self":     svc(1, "pod-a"),
		"affinity": svc(2, "pod-a", "pod-b", "pod-c"),
		"reject":   svc(3),
		"drop":     svc(4),
		"ranges":   svc(5, "pod-c"),
	}
	aff := d.services["affinity"]
	aff.Affinity = 10 * time.Second
	d.services["affinity"] = aff
	drop := d.services["drop"]
	drop.DropWithoutEndpoints = true
	d.services["drop"] = drop
	ranges := d.services["ranges"]
	ranges.SourceRanges = []netip.Prefix{netip.PrefixFrom(d.allowed, 32)}
	d.services["ranges"] = ranges
	return d
}

func (d *dataMapNetwork) all() []Service {
	var svcs []Service
	for _, name := range []string{"balanced", "self", "affinity", "reject", "drop", "ranges"} {
		svcs = append(svcs, d.services[name])
	}
	return svcs
}

func (d *dataMapNetwork) addr(name string) netip.AddrPort {
	s := d.services[name]
	return netip.AddrPortFrom(s.ClusterIP, s.Port)
}

// replies dials svc n times from ns (from src, if valid) and counts the
// backends that answered and the client addresses they saw.
func replies(t *testing.T, ns *kerneltest.NS, src netip.Addr, dst netip.AddrPort, n int) (backends, clients map[string]int) {
	t.Helper()
	backends, clients = map[string]int{}, map[string]int{}
	for range n {
		r, err := kerneltest.DialFrom(ns, "tcp", src, dst, 2*time.Second)
		if err != nil {
			t.Fatalf("dial %s: %v", dst, err)
		}
		backends[r.Name]++
		clients[r.Client.String()]++
	}
	return backends, clients
}

func keys(m map[string]int) []string { return slices.Sorted(maps.Keys(m)) }

// TestDataMapPackets loads the DataMap layout into a node namespace
// (skeleton through nft, elements through netlink, as BENCHMARKS.md
// recommends) and checks with real connections kube-proxy's observable
// behaviour: random balancing over the endpoints, masquerade of clients
// outside ClusterCIDR and of a pod that reaches itself, none for a pod
// reaching another, ClientIP affinity, reject and drop without endpoints,
// source ranges; then the one-endpoint changes through netlink.
func TestDataMapPackets(t *testing.T) {
	kerneltest.Require(t, "nft")
	d := newDataMapNetwork(t)
	skeleton, elements := DataMapLoad(d.all())
	if _, err := d.tab.execRun(skeleton); err != nil {
		t.Fatalf("skeleton through nft: %v", err)
	}
	plain, intervals := splitIntervals(elements)
	if _, err := d.tab.netlinkRun(plain); err != nil {
		t.Fatalf("elements through netlink: %v", err)
	}
	if _, err := d.tab.execRun(intervals); err != nil {
		t.Fatalf("interval elements through nft: %v", err)
	}
	client, podB := d.net.Client, d.net.Pods["pod-b"]
	noSrc := netip.Addr{}

	backends, clients := replies(t, client, noSrc, d.addr("balanced"), 40)
	if diff := cmp.Diff([]string{"pod-a", "pod-b"}, keys(backends)); diff != "" {
		t.Errorf("balanced from the client: backends (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{d.bridge.String()}, keys(clients)); diff != "" {
		t.Errorf("balanced from the client (off-cluster, masqueraded): sources seen (-want +got):\n%s", diff)
	}

	// pod-b reaching the service lands on pod-a (seen as itself) or on
	// itself (hairpin: seen as the node).
	backends, clients = replies(t, podB, noSrc, d.addr("balanced"), 40)
	if diff := cmp.Diff([]string{"pod-a", "pod-b"}, keys(backends)); diff != "" {
		t.Errorf("balanced from pod-b: backends (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{d.bridge.String(), d.pods["pod-b"].Addr().String()}, keys(clients)); diff != "" {
		t.Errorf("balanced from pod-b: sources seen (-want +got):\n%s", diff)
	}
	if backends["pod-b"] != clients[d.bridge.String()] {
		t.Errorf("balanced from pod-b: %d replies from itself but %d masqueraded", backends["pod-b"], clients[d.bridge.String()])
	}
	backends, clients = replies(t, d.net.Pods["pod-a"], noSrc, d.addr("self"), 3)
	if diff := cmp.Diff(map[string]int{"pod-a": 3}, backends); diff != "" {
		t.Errorf("hairpin: backends (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{d.bridge.String(): 3}, clients); diff != "" {
		t.Errorf("hairpin: sources seen (-want +got):\n%s", diff)
	}

	backends, _ = replies(t, client, noSrc, d.addr("affinity"), 15)
	if len(backends) != 1 {
		t.Errorf("affinity: one client reached %v, want one backend", backends)
	}
	stuck := keys(backends)[0]
	backends, _ = replies(t, client, d.allowed, d.addr("affinity"), 15)
	if len(backends) != 1 {
		t.Errorf("affinity: the second client reached %v, want one backend", backends)
	}

	// The affinity service's endpoint that the client sticks to becomes
	// pod-d (through nft: the change holds rules): the client is picked
	// afresh and sticks again, never to the old endpoint.
	aff := d.services["affinity"]
	j := slices.Index(aff.Endpoints, d.pods[stuck])
	if _, err := d.tab.execRun(AffinityReplaceEndpoint(aff, j, d.pods["pod-d"])); err != nil {
		t.Fatalf("replacing %s in the affinity service: %v", stuck, err)
	}
	backends, _ = replies(t, client, noSrc, d.addr("affinity"), 15)
	if len(backends) != 1 || backends[stuck] != 0 {
		t.Errorf("affinity after replacing %s: the client reached %v, want one backend, not %s", stuck, backends, stuck)
	}

	if _, err := kerneltest.Dial(client, "tcp", d.addr("reject"), 2*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("no endpoints, reject: got %v, want connection refused", err)
	}
	if _, err := kerneltest.Dial(client, "tcp", d.addr("drop"), time.Second); !kerneltest.IsTimeout(err) {
		t.Errorf("no endpoints, drop: got %v, want a timeout", err)
	}

	if _, err := kerneltest.DialFrom(client, "tcp", d.client, d.addr("ranges"), time.Second); !kerneltest.IsTimeout(err) {
		t.Errorf("source ranges, client outside: got %v, want a timeout (dropped)", err)
	}
	if r, err := kerneltest.DialFrom(client, "tcp", d.allowed, d.addr("ranges"), 2*time.Second); err != nil || r.Name != "pod-c" {
		t.Errorf("source ranges, client inside: got %+v, %v, want pod-c", r, err)
	}

	// The one-endpoint changes, through netlink: balanced's pod-b becomes
	// pod-c, then pod-a goes.
	balanced := d.services["balanced"]
	if _, err := d.tab.netlinkRun(DataMapReplaceEndpoint(balanced, 1, d.pods["pod-c"])); err != nil {
		t.Fatal(err)
	}
	balanced.Endpoints[1] = d.pods["pod-c"]
	backends, _ = replies(t, client, noSrc, d.addr("balanced"), 40)
	if diff := cmp.Diff([]string{"pod-a", "pod-c"}, keys(backends)); diff != "" {
		t.Errorf("after replacing pod-b by pod-c: backends (-want +got):\n%s", diff)
	}
	if _, err := d.tab.netlinkRun(DataMapRemoveEndpoint(balanced, 0)); err != nil {
		t.Fatal(err)
	}
	backends, _ = replies(t, client, noSrc, d.addr("balanced"), 20)
	if diff := cmp.Diff(map[string]int{"pod-c": 20}, backends); diff != "" {
		t.Errorf("after removing pod-a: backends (-want +got):\n%s", diff)
	}
}

// splitIntervals splits c into the operations the netlink translator
// takes and FirewallAllowSet's interval elements, which it refuses.
func splitIntervals(c Change) (rest, intervals Change) {
	for _, op := range c {
		if e, ok := op.Object.(*knftables.Element); ok && e.Set == FirewallAllowSet {
			intervals = append(intervals, op)
		} else {
			rest = append(rest, op)
		}
	}
	return rest, intervals
}

// loadedDataMap loads n generated services in the DataMap layout into a
// new namespace through nft.
func loadedDataMap(t *testing.T, n int) ([]Service, *nftTable) {
	t.Helper()
	kerneltest.Require(t, "nft")
	svcs, err := Cluster(n, 10)
	if err != nil {
		t.Fatal(err)
	}
	tab := newNFTTable(t)
	tab.mustLoad(t, DataMap, svcs)
	return svcs, tab
}

// TestDataMapNetlinkMatchesExec loads the DataMap layout of 100 services
// (with affinity, no-endpoint and source-range services among them) all
// through nft in one namespace and, in another, the skeleton through nft
// and the elements through netlink; applies the one-endpoint changes both
// ways; and checks that nft lists the same table, with the changes in it.
func TestDataMapNetlinkMatchesExec(t *testing.T) {
	kerneltest.Require(t, "nft")
	svcs, err := Cluster(100, 10)
	if err != nil {
		t.Fatal(err)
	}
	svcs[3].Affinity = time.Hour
	svcs[4].Endpoints, svcs[4].Local = nil, nil
	svcs[5].Endpoints, svcs[5].Local, svcs[5].DropWithoutEndpoints = nil, nil, true
	svcs[6].SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.168.0.0/24"), netip.MustParsePrefix("10.9.0.0/16")}
	viaExec, viaNetlink := newNFTTable(t), newNFTTable(t)
	viaExec.mustLoad(t, DataMap, svcs)
	skeleton, elements := DataMapLoad(svcs)
	plain, intervals := splitIntervals(elements)
	if _, err := viaNetlink.execRun(append(skeleton, intervals...)); err != nil {
		t.Fatalf("skeleton through nft: %v", err)
	}
	if _, err := viaNetlink.netlinkRun(plain); err != nil {
		t.Fatalf("elements through netlink: %v", err)
	}
	if diff := cmp.Diff(viaExec.list(t), viaNetlink.list(t)); diff != "" {
		t.Fatalf("the two loads differ (-exec +netlink):\n%s", diff)
	}
	to := netip.MustParseAddrPort("10.200.0.1:9090")
	replaced := svcs[7]
	replaced.Endpoints = append([]netip.AddrPort(nil), svcs[7].Endpoints...)
	replaced.Endpoints[3] = to
	steps := []Change{
		DataMapReplaceEndpoint(svcs[7], 3, to),
		DataMapRemoveEndpoint(replaced, 0),
		DataMapRemoveEndpoint(svcs[8], 9),
	}
	after := applyBoth(t, viaExec, viaNetlink, steps)
	for _, want := range []string{
		"172.30.0.7 . tcp . 80 . 0 : " + svcs[7].Endpoints[9].Addr().String() + " . 8080",
		"172.30.0.7 . tcp . 80 . 3 : 10.200.0.1 . 9090",
		"172.30.0.7 . tcp . 80 : goto " + LBChain(9),
		"172.30.0.8 . tcp . 80 : goto " + LBChain(9),
		"172.30.0.3 . tcp . 80 : goto " + ServiceChain(svcs[3]),
	} {
		if !strings.Contains(after, want) {
			t.Errorf("table after the changes lacks %q", want)
		}
	}
	for _, gone := range []string{"172.30.0.7 . tcp . 80 . 9 :", "172.30.0.8 . tcp . 80 . 9 :"} {
		if strings.Contains(after, gone) {
			t.Errorf("table after the changes still has %q", gone)
		}
	}
}

// TestDataMapBindings checks in the kernel the property the layout exists
// for: however many services, EndpointsDataMap is looked up by at most
// MaxEndpoints rules and the table holds no set per service.
func TestDataMapBindings(t *testing.T) {
	_, n := loadedDataMap(t, 300)
	conn, err := nftables.New(nftables.WithNetNSFd(int(n.ns.Handle())))
	if err != nil {
		t.Fatal(err)
	}
	sets, err := conn.GetSets(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: Table})
	if err != nil {
		t.Fatal(err)
	}
	if want := len(dataMapObjects[*knftables.Set]()) + len(dataMapObjects[*knftables.Map]()); len(sets) != want {
		t.Errorf("%d sets and maps at 300 services, want the skeleton's %d", len(sets), want)
	}
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	if want := len(dataMapObjects[*knftables.Chain]()); len(chains) != want {
		t.Errorf("%d chains at 300 services, want the skeleton's %d", len(chains), want)
	}
	rules := strings.Count(n.list(t), "map @"+EndpointsDataMap)
	if rules != MaxEndpoints {
		t.Errorf("%d rules look %s up, want %d", rules, EndpointsDataMap, MaxEndpoints)
	}
}

// dataMapObjects are the DataMap skeleton's objects of type T.
func dataMapObjects[T knftables.Object]() []T {
	var objs []T
	for _, op := range dataMapSkeleton() {
		if o, ok := op.Object.(T); ok {
			objs = append(objs, o)
		}
	}
	return objs
}
