package config

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"

	"github.com/proxykit/proxykit/changetracker"
)

// testProxier is a minimal proxier: its handlers feed the trackers.
type testProxier struct {
	svcTracker *changetracker.ServiceChangeTracker
	epTracker  *changetracker.EndpointsChangeTracker

	mu     sync.Mutex
	synced map[string]int
}

func (p *testProxier) OnServiceAdd(s *v1.Service)         { p.svcTracker.Update(nil, s) }
func (p *testProxier) OnServiceUpdate(old, s *v1.Service) { p.svcTracker.Update(old, s) }
func (p *testProxier) OnServiceDelete(s *v1.Service)      { p.svcTracker.Update(s, nil) }
func (p *testProxier) OnServiceSynced()                   { p.markSynced("services") }
func (p *testProxier) OnEndpointSliceAdd(s *discoveryv1.EndpointSlice) {
	p.epTracker.EndpointSliceUpdate(s, false)
}
func (p *testProxier) OnEndpointSliceUpdate(_, s *discoveryv1.EndpointSlice) {
	p.epTracker.EndpointSliceUpdate(s, false)
}
func (p *testProxier) OnEndpointSliceDelete(s *discoveryv1.EndpointSlice) {
	p.epTracker.EndpointSliceUpdate(s, true)
}
func (p *testProxier) OnEndpointSlicesSynced() { p.markSynced("endpointslices") }

func (p *testProxier) markSynced(what string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.synced[what]++
}

// capturingInformer wraps a real informer and remembers the handlers
// registered on it, so that a test can deliver a tombstone the way the
// informer does after a missed deletion.
type capturingInformer struct {
	cache.SharedIndexInformer
	mu       sync.Mutex
	handlers []cache.ResourceEventHandler
}

func (c *capturingInformer) AddEventHandlerWithOptions(h cache.ResourceEventHandler, o cache.HandlerOptions) (cache.ResourceEventHandlerRegistration, error) {
	c.mu.Lock()
	c.handlers = append(c.handlers, h)
	c.mu.Unlock()
	return c.SharedIndexInformer.AddEventHandlerWithOptions(h, o)
}

func (c *capturingInformer) deliverDelete(obj any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range c.handlers {
		h.OnDelete(obj)
	}
}

type sliceInformer struct {
	discoveryinformers.EndpointSliceInformer
	inf *capturingInformer
}

func (s sliceInformer) Informer() cache.SharedIndexInformer { return s.inf }

type serviceInformer struct {
	coreinformers.ServiceInformer
	inf *capturingInformer
}

func (s serviceInformer) Informer() cache.SharedIndexInformer { return s.inf }

func TestInformerGlue(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	http := []port{namedPort("http", 8080, v1.ProtocolTCP)}
	svcA := makeService("ns", "a")
	sliceA := makeSlice("ns", "a", "a-1", discoveryv1.AddressTypeIPv4, http, readyEP("10.0.0.1", "node-a"))
	other := makeService("ns", "other", withClusterIPs("10.96.0.20"))
	other.Labels = map[string]string{ServiceProxyNameLabel: "someone-else"}
	otherSlice := makeSlice("ns", "other", "other-1", discoveryv1.AddressTypeIPv4, http, readyEP("10.0.0.9", "node-a"))
	otherSlice.Labels[ServiceProxyNameLabel] = "someone-else"
	headlessSlice := makeSlice("ns", "hl", "hl-1", discoveryv1.AddressTypeIPv4, http, readyEP("10.0.0.8", "node-a"))
	headlessSlice.Labels[v1.IsHeadlessService] = ""
	// kube-proxy selects Services by the proxy-name label (and cluster IP)
	// and slices by the headless label alone, so a ClusterIP Service with a
	// stray headless label is proxied, and so are the slices of a Service
	// whose proxy-name label was removed before its slices'.
	strayHeadless := makeService("ns", "c", withClusterIPs("10.96.0.30"))
	strayHeadless.Labels = map[string]string{v1.IsHeadlessService: ""}
	strayHeadlessSlice := makeSlice("ns", "c", "c-1", discoveryv1.AddressTypeIPv4, http, readyEP("10.0.0.30", "node-a"))
	unlabelled := makeService("ns", "d", withClusterIPs("10.96.0.40"))
	staleLabelSlice := makeSlice("ns", "d", "d-1", discoveryv1.AddressTypeIPv4, http, readyEP("10.0.0.40", "node-a"))
	staleLabelSlice.Labels[ServiceProxyNameLabel] = "someone-else"

	client := fake.NewClientset(svcA, sliceA, other, otherSlice, headlessSlice, strayHeadless, strayHeadlessSlice, unlabelled, staleLabelSlice)
	svcFactory := NewServiceInformerFactory(client, 0)
	sliceFactory := NewEndpointSliceInformerFactory(client, 0)
	svcInf := &capturingInformer{SharedIndexInformer: svcFactory.Core().V1().Services().Informer()}
	sliceInf := &capturingInformer{SharedIndexInformer: sliceFactory.Discovery().V1().EndpointSlices().Informer()}

	svcConfig, err := NewServiceConfig(ctx, serviceInformer{svcFactory.Core().V1().Services(), svcInf}, 0)
	if err != nil {
		t.Fatal(err)
	}
	sliceConfig, err := NewEndpointSliceConfig(ctx, sliceInformer{sliceFactory.Discovery().V1().EndpointSlices(), sliceInf}, 0)
	if err != nil {
		t.Fatal(err)
	}
	p := &testProxier{
		svcTracker: changetracker.NewServiceChangeTracker(v1.IPv4Protocol, nil),
		epTracker:  changetracker.NewEndpointsChangeTracker(v1.IPv4Protocol, "node-a", nil),
		synced:     map[string]int{},
	}
	svcConfig.RegisterEventHandler(p)
	sliceConfig.RegisterEventHandler(p)
	svcFactory.Start(ctx.Done())
	sliceFactory.Start(ctx.Done())
	defer func() {
		cancel() // Shutdown waits for the informers, which stop with ctx
		svcFactory.Shutdown()
		sliceFactory.Shutdown()
	}()
	if !svcConfig.Run(ctx) || !sliceConfig.Run(ctx) {
		t.Fatal("configs did not sync")
	}
	if diff := cmp.Diff(map[string]int{"services": 1, "endpointslices": 1}, p.synced); diff != "" {
		t.Errorf("synced calls (-want +got):\n%s", diff)
	}

	svcMap, epMap := changetracker.ServicePortMap{}, changetracker.EndpointsMap{}
	// sync applies pending changes once the informer has delivered them;
	// waiting is for event delivery, not a performance assertion.
	sync := func(what string, want func() bool) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			svcMap.Update(p.svcTracker)
			epMap.Update(p.epTracker)
			return want(), nil
		})
		if err != nil {
			t.Fatalf("%s: maps never reached the expected state: services %v, endpoints %v", what, describeServicePortMap(svcMap), describeEndpointsMap(epMap))
		}
	}
	aKey := "ns/a:http/TCP"

	// The initial list was delivered before Synced, so one Update must
	// show it: the Services without a proxy-name label, and the slices
	// without a headless label (the fake clientset filters lists by label;
	// it ignores the field selector, which the tracker's own check of the
	// cluster IP backs up).
	svcMap.Update(p.svcTracker)
	epMap.Update(p.epTracker)
	wantServices := map[string]string{
		aKey:            "10.96.0.10:80/TCP",
		"ns/c:http/TCP": "10.96.0.30:80/TCP",
		"ns/d:http/TCP": "10.96.0.40:80/TCP",
	}
	wantEndpoints := map[string][]string{
		aKey:                {"10.0.0.1:8080 local ready serving node=node-a"},
		"ns/c:http/TCP":     {"10.0.0.30:8080 local ready serving node=node-a"},
		"ns/d:http/TCP":     {"10.0.0.40:8080 local ready serving node=node-a"},
		"ns/other:http/TCP": {"10.0.0.9:8080 local ready serving node=node-a"},
	}
	if diff := cmp.Diff(wantServices, describeServicePortMap(svcMap)); diff != "" {
		t.Errorf("services after sync (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantEndpoints, describeEndpointsMap(epMap)); diff != "" {
		t.Errorf("endpoints after sync (-want +got):\n%s", diff)
	}
	for _, nn := range []string{"c", "d", "other"} {
		if err := client.CoreV1().Services("ns").Delete(ctx, nn, metav1.DeleteOptions{}); err != nil && nn != "other" {
			t.Fatal(err)
		}
		if err := client.DiscoveryV1().EndpointSlices("ns").Delete(ctx, nn+"-1", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sync("initial list", func() bool {
		return cmp.Equal(map[string]string{aKey: "10.96.0.10:80/TCP"}, describeServicePortMap(svcMap)) &&
			cmp.Equal(map[string][]string{aKey: {"10.0.0.1:8080 local ready serving node=node-a"}}, describeEndpointsMap(epMap))
	})

	// Update.
	svcA2 := svcA.DeepCopy()
	svcA2.Spec.Ports[0].Port = 81
	if _, err := client.CoreV1().Services("ns").Update(ctx, svcA2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sliceA2 := makeSlice("ns", "a", "a-1", discoveryv1.AddressTypeIPv4, http, readyEP("10.0.0.1", "node-a"), readyEP("10.0.0.2", "node-b"))
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, sliceA2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sync("update", func() bool {
		return cmp.Equal(map[string]string{aKey: "10.96.0.10:81/TCP"}, describeServicePortMap(svcMap)) && len(epMap[firstName(epMap)]) == 2
	})

	// Add a second slice, then delete it through the API.
	sliceB := makeSlice("ns", "a", "a-2", discoveryv1.AddressTypeIPv4, http, readyEP("10.0.0.3", "node-a"))
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Create(ctx, sliceB, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sync("add", func() bool { return len(epMap[firstName(epMap)]) == 3 })
	if err := client.DiscoveryV1().EndpointSlices("ns").Delete(ctx, "a-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sync("delete", func() bool { return len(epMap[firstName(epMap)]) == 2 })

	// A tombstone for the remaining slice, as after a missed deletion, and
	// a tombstone holding something that is not a slice (ignored).
	sliceInf.deliverDelete(cache.DeletedFinalStateUnknown{Key: "ns/a-1", Obj: sliceA2})
	sliceInf.deliverDelete(cache.DeletedFinalStateUnknown{Key: "ns/x", Obj: "not a slice"})
	epMap.Update(p.epTracker)
	if len(epMap) != 0 {
		t.Errorf("after the tombstone, endpoints = %v, want none", describeEndpointsMap(epMap))
	}
	svcInf.deliverDelete(cache.DeletedFinalStateUnknown{Key: "ns/a", Obj: svcA2})
	svcMap.Update(p.svcTracker)
	if len(svcMap) != 0 {
		t.Errorf("after the tombstone, services = %v, want none", describeServicePortMap(svcMap))
	}

	// Delete the Service through the API: it is already gone from the map,
	// and the event must not bring anything back.
	if err := client.CoreV1().Services("ns").Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	sync("service delete", func() bool { return len(svcMap) == 0 })
}

func firstName(m changetracker.EndpointsMap) changetracker.ServicePortName {
	for name := range m {
		return name
	}
	return changetracker.ServicePortName{}
}

func TestConfigRunCancelled(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	client := fake.NewClientset()
	factory := NewServiceInformerFactory(client, 0)
	cfg, err := NewServiceConfig(ctx, factory.Core().V1().Services(), 0)
	if err != nil {
		t.Fatal(err)
	}
	p := &testProxier{synced: map[string]int{}}
	cfg.RegisterEventHandler(p)
	cancel() // never started: Run must give up, without calling Synced
	if cfg.Run(ctx) {
		t.Error("Run returned true without a synced cache")
	}
	if len(p.synced) != 0 {
		t.Errorf("Synced called: %v", p.synced)
	}
}

// TestInformerSelectors checks the selectors against kube-proxy's
// (cmd/kube-proxy/app/server.go since 1.34): Services by the proxy-name
// label and spec.clusterIP!=None, EndpointSlices by the headless label.
func TestInformerSelectors(t *testing.T) {
	strings := []struct{ what, got, want string }{
		{"services", ServiceLabelSelector("").String(), "!service.kubernetes.io/service-proxy-name"},
		{"services of my-proxy", ServiceLabelSelector("my-proxy").String(), "service.kubernetes.io/service-proxy-name=my-proxy"},
		{"service fields", ServiceFieldSelector().String(), "spec.clusterIP!=None"},
		{"endpoint slices", EndpointSliceLabelSelector().String(), "!service.kubernetes.io/headless"},
	}
	for _, tc := range strings {
		if tc.got != tc.want {
			t.Errorf("%s: selector %q, want %q", tc.what, tc.got, tc.want)
		}
	}

	none := mapLabels{}
	proxied := mapLabels{ServiceProxyNameLabel: "someone-else"}
	mine := mapLabels{ServiceProxyNameLabel: "my-proxy"}
	headless := mapLabels{v1.IsHeadlessService: ""}
	both := mapLabels{ServiceProxyNameLabel: "someone-else", v1.IsHeadlessService: ""}
	tests := []struct {
		name                       string
		labels                     mapLabels
		wantService, wantMyService bool
		wantSlice                  bool
	}{
		{"no labels", none, true, false, true},
		{"another proxy's", proxied, false, false, true},
		{"my proxy's", mine, false, true, true},
		{"headless label", headless, true, false, false},
		{"both labels", both, false, false, false},
	}
	for _, tc := range tests {
		got := []bool{ServiceLabelSelector("").Matches(tc.labels), ServiceLabelSelector("my-proxy").Matches(tc.labels), EndpointSliceLabelSelector().Matches(tc.labels)}
		if diff := cmp.Diff([]bool{tc.wantService, tc.wantMyService, tc.wantSlice}, got); diff != "" {
			t.Errorf("%s: [service, my-proxy service, slice] matches (-want +got):\n%s", tc.name, diff)
		}
	}
	if sel := ServiceLabelSelector("not a valid value!"); sel.Matches(mapLabels{ServiceProxyNameLabel: "not a valid value!"}) || sel.Matches(mapLabels{}) {
		t.Errorf("selector for an invalid proxy name %q matches objects", sel)
	}
	for ip, want := range map[string]bool{"None": false, "10.96.0.1": true, "": true} {
		if got := ServiceFieldSelector().Matches(fields.Set{"spec.clusterIP": ip}); got != want {
			t.Errorf("field selector on clusterIP %q: %v, want %v", ip, got, want)
		}
	}
}

type mapLabels map[string]string

func (m mapLabels) Has(k string) bool              { _, ok := m[k]; return ok }
func (m mapLabels) Get(k string) string            { return m[k] }
func (m mapLabels) Lookup(k string) (string, bool) { v, ok := m[k]; return v, ok }

func TestNodeTopology(t *testing.T) {
	logger, ctx := ktesting.NewTestContext(t)
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: "zone-1", "other": "x"}}}
	client := fake.NewClientset(node, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b", Labels: map[string]string{v1.LabelTopologyZone: "zone-9"}}})
	var mu sync.Mutex
	var changes []map[string]string
	deleted := 0
	topo := changetracker.NewNodeTopology("node-a", changetracker.WithLogger(logger),
		changetracker.OnTopologyChange(func(l map[string]string) { mu.Lock(); changes = append(changes, l); mu.Unlock() }),
		changetracker.OnNodeDeleted(func() { mu.Lock(); deleted++; mu.Unlock() }))

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	factory := NewNodeInformerFactory(client, "node-a", 0)
	cfg, err := NewNodeConfig(ctx, factory.Core().V1().Nodes(), 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RegisterEventHandler(topo)
	factory.Start(ctx.Done())
	defer func() {
		cancel() // Shutdown waits for the informers, which stop with ctx
		factory.Shutdown()
	}()
	if !cfg.Run(ctx) {
		t.Fatal("node config did not sync")
	}
	if diff := cmp.Diff(map[string]string{v1.LabelTopologyZone: "zone-1"}, topo.Labels()); diff != "" {
		t.Errorf("labels after sync (-want +got):\n%s", diff)
	}

	// A change to an unrelated label is not a topology change.
	node2 := node.DeepCopy()
	node2.Labels["other"] = "y"
	topo.OnNodeUpdate(node, node2)
	node3 := node2.DeepCopy()
	node3.Labels[v1.LabelTopologyZone] = "zone-2"
	topo.OnNodeUpdate(node2, node3)
	// Another node's events are ignored.
	topo.OnNodeUpdate(nil, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b", Labels: map[string]string{v1.LabelTopologyZone: "zone-9"}}})
	topo.OnNodeDelete(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}})
	if topo.Deleted() {
		t.Error("another node's deletion marked this one deleted")
	}
	topo.OnNodeDelete(node3)

	mu.Lock()
	defer mu.Unlock()
	want := []map[string]string{
		{v1.LabelTopologyZone: "zone-1"},
		{v1.LabelTopologyZone: "zone-2"},
		{},
	}
	if diff := cmp.Diff(want, changes); diff != "" {
		t.Errorf("topology changes (-want +got):\n%s", diff)
	}
	if deleted != 1 || !topo.Deleted() || len(topo.Labels()) != 0 {
		t.Errorf("after deletion: deleted callbacks %d, Deleted() %v, labels %v", deleted, topo.Deleted(), topo.Labels())
	}
}
