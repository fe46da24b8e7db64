package proxier_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxy"
)

// state is what a recordingBackend last synced: per family, each service
// port's String() and its endpoints' String()s.
type state map[v1.IPFamily]map[string][]string

// recordingBackend records what it is given, fails the syncs the test asks
// it to, and hands the test the lost function of its Run.
type recordingBackend struct {
	mu sync.Mutex
	// state is as of the last good sync.
	state state
	// syncs counts calls to Sync, good or not.
	syncs int
	// failures is how many of the next syncs fail.
	failures int
	// shortResults is how many of the next syncs return no results and
	// no error, as a broken Backend might.
	shortResults int
	// full counts the good syncs whose inputs said Full.
	full int
	// inputs are copies of those of the last good sync, their maps
	// cloned: the Proxier changes its own between syncs.
	inputs []*proxy.FamilyInput
	lost   chan func()
}

func newRecordingBackend() *recordingBackend {
	return &recordingBackend{state: state{}, lost: make(chan func(), 1)}
}

func (b *recordingBackend) Sync(_ context.Context, ins []*proxy.FamilyInput) ([]proxy.SyncResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.syncs++
	results := make([]proxy.SyncResult, len(ins))
	if b.failures > 0 {
		b.failures--
		return results, errors.New("the datapath refused")
	}
	if b.shortResults > 0 {
		b.shortResults--
		return nil, nil
	}
	for i, in := range ins {
		st := map[string][]string{}
		for name, svc := range in.Services {
			eps := []string{}
			for _, ep := range in.Endpoints[name] {
				eps = append(eps, ep.String())
			}
			slices.Sort(eps)
			st[name.String()+" "+svc.String()] = eps
		}
		b.state[in.Family] = st
		results[i] = proxy.SyncResult{Full: in.Full, ServicePorts: len(st)}
	}
	if len(ins) > 0 && ins[0].Full {
		b.full++
	}
	b.inputs = b.inputs[:0]
	for _, in := range ins {
		cp := *in
		cp.Services, cp.Endpoints, cp.NodeLabels = maps.Clone(in.Services), maps.Clone(in.Endpoints), maps.Clone(in.NodeLabels)
		b.inputs = append(b.inputs, &cp)
	}
	return results, nil
}

func (b *recordingBackend) Run(ctx context.Context, lost func()) {
	b.lost <- lost
	<-ctx.Done()
}

// snapshot returns a copy of the state and the counters.
func (b *recordingBackend) snapshot() (st state, syncs, full int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	st = state{}
	for f, m := range b.state {
		st[f] = map[string][]string{}
		for k, v := range m {
			st[f][k] = slices.Clone(v)
		}
	}
	return st, b.syncs, b.full
}

// eventually polls check until it returns nil, failing t with its last
// error after a long timeout: the wait is for informer events and runner
// wake-ups, not a performance assertion.
func eventually(t *testing.T, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func testNode(addrs ...string) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}
	for _, a := range addrs {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: a})
	}
	return n
}

func testService(name string, port int32, clusterIPs ...string) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: v1.ServiceSpec{
			ClusterIP: clusterIPs[0], ClusterIPs: clusterIPs,
			Ports: []v1.ServicePort{{Name: "p", Port: port, Protocol: v1.ProtocolTCP}},
		},
	}
}

func testSlice(svc, name string, at discoveryv1.AddressType, addrs ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: at,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("p"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
	}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	return s
}

// startProxier runs a Proxier over client in the background until the
// test ends, with groups made by group from the node, and returns the
// error channel of its Run.
func startProxier(t *testing.T, client kubernetes.Interface, newBackends proxier.NewBackendsFunc, opts ...proxier.Option) <-chan error {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	return startProxierIn(t, ctx, client, newBackends, opts...)
}

// startProxierIn is startProxier logging through ctx's logger.
func startProxierIn(t *testing.T, ctx context.Context, client kubernetes.Interface, newBackends proxier.NewBackendsFunc, opts ...proxier.Option) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	p, err := proxier.New(client, "node-a", newBackends, opts...)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v after cancel, want nil", err)
		}
	})
	return done
}

// TestProxierFollowsTheCluster drives a custom Backend through a fake
// clientset: Services and EndpointSlices added, updated and deleted on a
// dual-stack node, with one Backend per family and with one for both.
// Syncs happen only when asked for (the sync period is an hour), so each
// state the Backend reaches came from the events.
func TestProxierFollowsTheCluster(t *testing.T) {
	for _, tc := range []struct {
		name string
		// perFamily gives each family a backend and a group of its own.
		perFamily bool
	}{{"a backend per family", true}, {"one backend for both", false}} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(testNode("192.168.0.1", "fd00::1"))
			// The factory runs in Run's goroutine; made hands its backends
			// to the test.
			made := make(chan map[v1.IPFamily]*recordingBackend, 1)
			newBackends := func(_ context.Context, node proxier.Node, _ *proxy.Metrics) ([]proxier.BackendGroup, error) {
				backends := map[v1.IPFamily]*recordingBackend{}
				defer func() { made <- backends }()
				if diff := cmp.Diff([]v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}, node.Families); diff != "" {
					return nil, fmt.Errorf("node families (-want +got):\n%s", diff)
				}
				if !tc.perFamily {
					b := newRecordingBackend()
					backends[v1.IPv4Protocol], backends[v1.IPv6Protocol] = b, b
					return []proxier.BackendGroup{{Backend: b, Families: node.Families}}, nil
				}
				var groups []proxier.BackendGroup
				for _, f := range node.Families {
					backends[f] = newRecordingBackend()
					groups = append(groups, proxier.BackendGroup{Backend: backends[f], Families: []v1.IPFamily{f}})
				}
				return groups, nil
			}
			startProxier(t, client, newBackends, proxier.WithSyncPeriods(0, time.Hour))
			backends := <-made
			ctx := context.Background()
			want := func(what string, w state) {
				t.Helper()
				eventually(t, what, func() error {
					got := state{}
					for _, f := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
						st, _, _ := backends[f].snapshot()
						got[f] = st[f]
					}
					if diff := cmp.Diff(w, got); diff != "" {
						return fmt.Errorf("backend state (-want +got):\n%s", diff)
					}
					return nil
				})
			}
			want("the empty cluster", state{v1.IPv4Protocol: {}, v1.IPv6Protocol: {}})

			// Add: a dual-stack Service, a single-stack one.
			dual := testService("dual", 80, "10.96.0.10", "fd00:96::10")
			if _, err := client.CoreV1().Services("ns").Create(ctx, dual, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := client.CoreV1().Services("ns").Create(ctx, testService("four", 53, "10.96.0.53"), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			for _, s := range []*discoveryv1.EndpointSlice{
				testSlice("dual", "dual-4", discoveryv1.AddressTypeIPv4, "10.244.0.1"),
				testSlice("dual", "dual-6", discoveryv1.AddressTypeIPv6, "fd00:244::1"),
				testSlice("four", "four-4", discoveryv1.AddressTypeIPv4, "10.244.0.53"),
			} {
				if _, err := client.DiscoveryV1().EndpointSlices("ns").Create(ctx, s, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			want("adds", state{
				v1.IPv4Protocol: {
					"ns/dual:p 10.96.0.10:80/TCP": {"10.244.0.1:8080"},
					"ns/four:p 10.96.0.53:53/TCP": {"10.244.0.53:8080"},
				},
				v1.IPv6Protocol: {"ns/dual:p [fd00:96::10]:80/TCP": {"[fd00:244::1]:8080"}},
			})

			// Update: the dual-stack Service's port, an IPv6 endpoint more.
			dual2 := testService("dual", 81, "10.96.0.10", "fd00:96::10")
			if _, err := client.CoreV1().Services("ns").Update(ctx, dual2, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx,
				testSlice("dual", "dual-6", discoveryv1.AddressTypeIPv6, "fd00:244::1", "fd00:244::2"), metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			want("updates", state{
				v1.IPv4Protocol: {
					"ns/dual:p 10.96.0.10:81/TCP": {"10.244.0.1:8080"},
					"ns/four:p 10.96.0.53:53/TCP": {"10.244.0.53:8080"},
				},
				v1.IPv6Protocol: {"ns/dual:p [fd00:96::10]:81/TCP": {"[fd00:244::1]:8080", "[fd00:244::2]:8080"}},
			})

			// Delete: the dual-stack Service and its slices, one slice of
			// the other.
			if err := client.CoreV1().Services("ns").Delete(ctx, "dual", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{"dual-4", "dual-6", "four-4"} {
				if err := client.DiscoveryV1().EndpointSlices("ns").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			want("deletes", state{
				v1.IPv4Protocol: {"ns/four:p 10.96.0.53:53/TCP": {}},
				v1.IPv6Protocol: {},
			})
		})
	}
}

// TestProxierRetriesAFailedSync checks that a sync that fails is tried
// again within the retry period, with no event to ask for it: with a sync
// period of an hour, only the retry can bring the second and third syncs,
// and the third, good one delivers the cluster.
func TestProxierRetriesAFailedSync(t *testing.T) {
	client := fake.NewClientset(testNode("192.168.0.1"), testService("web", 80, "10.96.0.10"),
		testSlice("web", "web-1", discoveryv1.AddressTypeIPv4, "10.244.0.1"))
	b := newRecordingBackend()
	b.failures = 2
	reg := prometheus.NewRegistry()
	startProxier(t, client, func(_ context.Context, node proxier.Node, _ *proxy.Metrics) ([]proxier.BackendGroup, error) {
		// The primary family alone, as on a host without IPv6.
		return []proxier.BackendGroup{{Backend: b, Families: node.Families[:1]}}, nil
	}, proxier.WithSyncPeriods(0, time.Hour), proxier.WithRetryPeriod(10*time.Millisecond), proxier.WithMetricsRegisterer(reg))
	want := state{v1.IPv4Protocol: {"ns/web:p 10.96.0.10:80/TCP": {"10.244.0.1:8080"}}}
	eventually(t, "the cluster after two failed syncs", func() error {
		st, syncs, _ := b.snapshot()
		if diff := cmp.Diff(want, st); diff != "" {
			return fmt.Errorf("after %d syncs, state (-want +got):\n%s", syncs, diff)
		}
		return nil
	})
	if _, syncs, _ := b.snapshot(); syncs != 3 {
		t.Errorf("%d syncs, want 2 failed and 1 good", syncs)
	}
	// The metrics saw all three, and the good one's time.
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch {
			case m.GetHistogram() != nil:
				got[f.GetName()] = float64(m.GetHistogram().GetSampleCount())
			case m.GetGauge() != nil:
				got[f.GetName()] = min(m.GetGauge().GetValue(), 1)
			}
		}
	}
	for name, v := range map[string]float64{
		"kubeproxy_sync_proxy_rules_duration_seconds":       3,
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds": 1,
	} {
		if got[name] != v {
			t.Errorf("metric %s = %v, want %v", name, got[name], v)
		}
	}
}

// TestProxierSurvivesShortResults checks that a Backend whose Sync returns
// fewer results than inputs does not crash the proxy: the sync counts as
// failed, the Backend is asked for a full one, and the retry brings it.
func TestProxierSurvivesShortResults(t *testing.T) {
	client := fake.NewClientset(testNode("192.168.0.1"), testService("web", 80, "10.96.0.10"),
		testSlice("web", "web-1", discoveryv1.AddressTypeIPv4, "10.244.0.1"))
	b := newRecordingBackend()
	b.shortResults = 1
	startProxier(t, client, func(_ context.Context, node proxier.Node, _ *proxy.Metrics) ([]proxier.BackendGroup, error) {
		return []proxier.BackendGroup{{Backend: b, Families: node.Families}}, nil
	}, proxier.WithSyncPeriods(0, time.Hour), proxier.WithRetryPeriod(10*time.Millisecond))
	eventually(t, "a full sync after the short one", func() error {
		_, syncs, full := b.snapshot()
		if syncs < 2 || full < 1 {
			return fmt.Errorf("%d syncs, %d of them full; want the short one, then a full one", syncs, full)
		}
		return nil
	})
}

// TestProxierFullResyncOnLost checks that when a Backend's Run calls lost
// (another program removed its state), the Proxier asks the Backend for a
// full sync and runs one, with no change in the cluster and the sync
// period an hour away.
func TestProxierFullResyncOnLost(t *testing.T) {
	client := fake.NewClientset(testNode("192.168.0.1"), testService("web", 80, "10.96.0.10"))
	b := newRecordingBackend()
	startProxier(t, client, func(_ context.Context, node proxier.Node, _ *proxy.Metrics) ([]proxier.BackendGroup, error) {
		return []proxier.BackendGroup{{Backend: b, Families: node.Families}}, nil
	}, proxier.WithSyncPeriods(0, time.Hour))
	lost := <-b.lost
	var before, fullBefore int
	eventually(t, "the first sync", func() error {
		var st state
		st, before, fullBefore = b.snapshot()
		if len(st[v1.IPv4Protocol]) != 1 {
			return fmt.Errorf("state %v", st)
		}
		return nil
	})
	if fullBefore != 1 {
		t.Errorf("%d of the first syncs were full, want the first alone", fullBefore)
	}
	lost()
	eventually(t, "a full sync after lost", func() error {
		_, syncs, full := b.snapshot()
		if syncs <= before || full != fullBefore+1 {
			return fmt.Errorf("%d syncs (%d before lost), %d full (%d before)", syncs, before, full, fullBefore)
		}
		return nil
	})
}

// TestProxierInputSaysWhatChanged checks the inputs a Backend gets after
// the first: one whose Service's endpoints alone changed names it in
// ChangedServices with its ports and is not Full; a change of the node's
// labels makes the next input Full.
func TestProxierInputSaysWhatChanged(t *testing.T) {
	client := fake.NewClientset(testNode("192.168.0.1"), testService("web", 80, "10.96.0.10"), testService("db", 5432, "10.96.0.11"),
		testSlice("web", "web-1", discoveryv1.AddressTypeIPv4, "10.244.0.1"))
	b := newRecordingBackend()
	startProxier(t, client, func(_ context.Context, node proxier.Node, _ *proxy.Metrics) ([]proxier.BackendGroup, error) {
		return []proxier.BackendGroup{{Backend: b, Families: node.Families}}, nil
	}, proxier.WithSyncPeriods(0, time.Hour))
	lastInput := func() *proxy.FamilyInput {
		b.mu.Lock()
		defer b.mu.Unlock()
		if len(b.inputs) == 0 {
			return nil
		}
		return b.inputs[0]
	}
	eventually(t, "the first sync", func() error {
		if in := lastInput(); in == nil || len(in.Endpoints) != 1 {
			return fmt.Errorf("input %+v", in)
		}
		return nil
	})
	if in := lastInput(); !in.Full {
		t.Error("the first input is not Full")
	}
	ctx := context.Background()
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, testSlice("web", "web-1", discoveryv1.AddressTypeIPv4, "10.244.0.1", "10.244.0.2"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	web := types.NamespacedName{Namespace: "ns", Name: "web"}
	webPort := changetracker.ServicePortName{NamespacedName: web, Port: "p", Protocol: v1.ProtocolTCP}
	eventually(t, "the sync of the endpoint change", func() error {
		in := lastInput()
		if len(in.Endpoints[webPort]) != 2 {
			return fmt.Errorf("endpoints %v", in.Endpoints)
		}
		if diff := cmp.Diff(map[types.NamespacedName][]changetracker.ServicePortName{web: {webPort}}, in.ChangedServices); diff != "" {
			return fmt.Errorf("ChangedServices (-want +got):\n%s", diff)
		}
		if in.Full {
			return errors.New("the input of an endpoint change is Full")
		}
		return nil
	})
	node := testNode("192.168.0.1")
	node.Labels = map[string]string{v1.LabelTopologyZone: "zone-b"}
	if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a Full input after the node's labels changed", func() error {
		in := lastInput()
		if in.NodeLabels[v1.LabelTopologyZone] != "zone-b" || !in.Full {
			return fmt.Errorf("labels %v, Full %v", in.NodeLabels, in.Full)
		}
		return nil
	})
}

// TestNewRefuses checks New's argument checks, and that a registry that
// already holds a Proxier's metrics refuses a second one's, whole.
func TestNewRefuses(t *testing.T) {
	client := fake.NewClientset()
	factory := func(context.Context, proxier.Node, *proxy.Metrics) ([]proxier.BackendGroup, error) {
		return nil, nil
	}
	taken := prometheus.NewRegistry()
	if _, err := proxier.New(client, "node-a", factory, proxier.WithMetricsRegisterer(taken)); err != nil {
		t.Fatal(err)
	}
	before, err := taken.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		client   kubernetes.Interface
		nodeName string
		factory  proxier.NewBackendsFunc
		opts     []proxier.Option
		want     string
	}{
		{"no client", nil, "node-a", factory, nil, "no Kubernetes client"},
		{"no node name", client, "", factory, nil, "node name is empty"},
		{"no factory", client, "node-a", nil, nil, "no backend factory"},
		{"zero sync period", client, "node-a", factory, []proxier.Option{proxier.WithSyncPeriods(0, 0)}, "must be positive"},
		{"min above max", client, "node-a", factory, []proxier.Option{proxier.WithSyncPeriods(2*time.Second, time.Second)}, "must be between"},
		{"zero retry", client, "node-a", factory, []proxier.Option{proxier.WithRetryPeriod(0)}, "retry period"},
		{"registry taken", client, "node-a", factory, []proxier.Option{proxier.WithMetricsRegisterer(taken)}, "registering"},
	} {
		_, err := proxier.New(tc.client, tc.nodeName, tc.factory, tc.opts...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New returned %v, want an error with %q", tc.name, err, tc.want)
		}
	}
	after, err := taken.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("the refused Proxier left %d metric families, want the first's %d", len(after), len(before))
	}
}

// TestRunRefusesBadGroups checks that Run fails, naming the problem, when
// the factory's groups do not fit the node.
func TestRunRefusesBadGroups(t *testing.T) {
	b := newRecordingBackend()
	for _, tc := range []struct {
		name   string
		groups []proxier.BackendGroup
		want   string
	}{
		{"none", nil, "made no backend"},
		{"not an IP family", []proxier.BackendGroup{{Backend: b, Families: []v1.IPFamily{"IPv5"}}}, "not an IP family"},
		{"a family twice in a group", []proxier.BackendGroup{{Backend: b, Families: []v1.IPFamily{v1.IPv4Protocol, v1.IPv4Protocol}}}, "lists IPv4 twice"},
		{"no backend", []proxier.BackendGroup{{Families: []v1.IPFamily{v1.IPv4Protocol}}}, "no backend or no family"},
	} {
		_, ctx := ktesting.NewTestContext(t)
		p, err := proxier.New(fake.NewClientset(testNode("192.168.0.1")), "node-a",
			func(context.Context, proxier.Node, *proxy.Metrics) ([]proxier.BackendGroup, error) {
				return tc.groups, nil
			})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Run(ctx); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Run returned %v, want an error with %q", tc.name, err, tc.want)
		}
		if err := p.Run(ctx); err == nil || !strings.Contains(err.Error(), "twice") {
			t.Errorf("%s: a second Run returned %v, want an error", tc.name, err)
		}
	}
}

// TestProxierNodeEligibility checks that the proxy health server's
// /healthz follows this node's Node object: healthy once synced, failing
// while the Node is being deleted, and /livez healthy throughout.
func TestProxierNodeEligibility(t *testing.T) {
	node := testNode("192.168.0.1")
	client := fake.NewClientset(node)
	listen, listening := listenLoopback()
	b := newRecordingBackend()
	startProxier(t, client, func(_ context.Context, n proxier.Node, _ *proxy.Metrics) ([]proxier.BackendGroup, error) {
		return []proxier.BackendGroup{{Backend: b, Families: n.Families}}, nil
	}, proxier.WithSyncPeriods(0, time.Hour), proxier.WithProxyHealthServer("127.0.0.1:10256"), proxier.WithListenFunc(listen))
	addr := <-listening
	status := func(path string) (int, error) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	wantStatus := func(what string, healthz, livez int) {
		t.Helper()
		eventually(t, what, func() error {
			h, err := status("/healthz")
			if err != nil {
				return err
			}
			l, err := status("/livez")
			if err != nil {
				return err
			}
			if h != healthz || l != livez {
				return fmt.Errorf("/healthz %d, /livez %d; want %d and %d", h, l, healthz, livez)
			}
			return nil
		})
	}
	wantStatus("synced", http.StatusOK, http.StatusOK)

	deleting := node.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	if _, err := client.CoreV1().Nodes().Update(context.Background(), deleting, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wantStatus("the Node being deleted", http.StatusServiceUnavailable, http.StatusOK)
}

// recordingCleaner is a ConntrackCleaner that records the deleted cluster
// IPs of each call and fails while fail is set.
type recordingCleaner struct {
	mu      sync.Mutex
	fail    bool
	deleted [][]string
}

func (c *recordingCleaner) CleanStaleEntries(_ context.Context, _ v1.IPFamily, _ changetracker.ServicePortMap,
	_ changetracker.EndpointsMap, deletedClusterIPs sets.Set[netip.Addr]) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ips []string
	for ip := range deletedClusterIPs {
		ips = append(ips, ip.String())
	}
	slices.Sort(ips)
	c.deleted = append(c.deleted, ips)
	if c.fail {
		return 0, errors.New("netlink refused")
	}
	return len(ips), nil
}

func (c *recordingCleaner) calls() [][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.deleted)
}

// TestProxierCleansConntrack checks that a good sync after a UDP Service
// is deleted hands the cleaner its cluster IP, and that after a failed
// cleanup the next one gets it again.
func TestProxierCleansConntrack(t *testing.T) {
	dns := testService("dns", 53, "10.96.0.53")
	dns.Spec.Ports[0].Protocol = v1.ProtocolUDP
	client := fake.NewClientset(testNode("192.168.0.1"), dns)
	cleaner := &recordingCleaner{fail: true}
	b := newRecordingBackend()
	startProxier(t, client, func(_ context.Context, n proxier.Node, _ *proxy.Metrics) ([]proxier.BackendGroup, error) {
		return []proxier.BackendGroup{{Backend: b, Families: n.Families}}, nil
	}, proxier.WithSyncPeriods(0, time.Hour), proxier.WithConntrack(cleaner))
	eventually(t, "the first sync", func() error {
		if st, _, _ := b.snapshot(); len(st[v1.IPv4Protocol]) != 1 {
			return fmt.Errorf("state %v", st)
		}
		return nil
	})
	if err := client.CoreV1().Services("ns").Delete(context.Background(), "dns", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a cleanup of the deleted service", func() error {
		calls := cleaner.calls()
		if len(calls) == 0 || !slices.Equal(calls[len(calls)-1], []string{"10.96.0.53"}) {
			return fmt.Errorf("cleanups with deleted cluster IPs %q", calls)
		}
		return nil
	})
	cleaner.mu.Lock()
	cleaner.fail = false
	n := len(cleaner.deleted)
	cleaner.mu.Unlock()
	// A change of another Service brings the next sync, whose cleanup
	// must still carry the IP the failed one did not clean.
	if _, err := client.CoreV1().Services("ns").Create(context.Background(), testService("web", 80, "10.96.0.80"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the cleanup after the failed one", func() error {
		calls := cleaner.calls()
		if len(calls) <= n {
			return fmt.Errorf("no cleanup after the failed one: %q", calls)
		}
		if !slices.Equal(calls[n], []string{"10.96.0.53"}) {
			return fmt.Errorf("the cleanup after the failed one had deleted cluster IPs %q, want the failed one's", calls[n])
		}
		return nil
	})
}

// TestProxierFollowsNodeAddresses checks that a change of the Node's
// addresses reaches the Backend: the next input of the family carries the
// new ones and is Full, and a Node that lists no address of the family any
// more leaves it the ones it had.
func TestProxierFollowsNodeAddresses(t *testing.T) {
	client := fake.NewClientset(testNode("192.168.0.1"), testService("web", 80, "10.96.0.10"))
	b := newRecordingBackend()
	startProxier(t, client, func(_ context.Context, node proxier.Node, _ *proxy.Metrics) ([]proxier.BackendGroup, error) {
		return []proxier.BackendGroup{{Backend: b, Families: node.Families}}, nil
	}, proxier.WithSyncPeriods(0, time.Hour))
	nodeIPs := func() ([]netip.Addr, bool) {
		b.mu.Lock()
		defer b.mu.Unlock()
		if len(b.inputs) == 0 {
			return nil, false
		}
		return b.inputs[0].NodeIPs, b.inputs[0].Full
	}
	want := func(what string, addrs ...string) {
		t.Helper()
		var ips []netip.Addr
		for _, a := range addrs {
			ips = append(ips, netip.MustParseAddr(a))
		}
		eventually(t, what, func() error {
			got, full := nodeIPs()
			if !slices.Equal(got, ips) || !full {
				return fmt.Errorf("NodeIPs %v, Full %v; want %v, Full", got, full, ips)
			}
			return nil
		})
	}
	want("the first sync", "192.168.0.1")
	ctx := context.Background()
	if _, err := client.CoreV1().Nodes().Update(ctx, testNode("192.168.0.2", "192.168.0.3"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("the sync after the Node's addresses changed", "192.168.0.2", "192.168.0.3")
	// Only an IPv6 address now: IPv4 keeps what it had, and the labels
	// change so that a sync comes to show it.
	node := testNode("fd00::1")
	node.Labels = map[string]string{v1.LabelTopologyZone: "zone-c"}
	if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the sync after the labels changed", func() error {
		b.mu.Lock()
		defer b.mu.Unlock()
		if in := b.inputs[0]; in.NodeLabels[v1.LabelTopologyZone] != "zone-c" {
			return fmt.Errorf("labels %v", in.NodeLabels)
		}
		return nil
	})
	if got, _ := nodeIPs(); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("192.168.0.2"), netip.MustParseAddr("192.168.0.3")}) {
		t.Errorf("IPv4 NodeIPs after the Node lost its IPv4 addresses: %v, want the last ones", got)
	}
}
