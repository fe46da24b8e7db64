package config

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// TestInformerFactoriesTrimObjects checks that the objects the factories'
// informers cache (and hand to handlers) lack what no proxier reads, and
// keep what the trackers and a MakeServicePortFunc do.
func TestInformerFactoriesTrimObjects(t *testing.T) {
	managed := []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate,
		FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:spec":{}}`)}}
	svc := makeService("ns", "web", func(s *v1.Service) {
		s.ManagedFields = managed
		s.Labels = map[string]string{"app": "web"}
		s.Annotations = map[string]string{lastApplied: `{"kind":"Service"}`, "example.com/mine": "x"}
	})
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-abc", GenerateName: "web-", ManagedFields: managed,
			Labels:          map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"},
			Annotations:     map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-01-01T00:00:00Z", "example.com/other": "y"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "web", UID: "u"}}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:          []string{"10.0.0.1"},
			Conditions:         discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			Hostname:           ptr.To("pod-1"),
			TargetRef:          &v1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "pod-1", UID: "p"},
			NodeName:           ptr.To("node-a"),
			Zone:               ptr.To("z1"),
			Hints:              &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "z1"}}},
			DeprecatedTopology: map[string]string{"k": "v"},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", ManagedFields: managed, Labels: map[string]string{"l": "v"}}}

	wantSvc := svc.DeepCopy()
	wantSvc.ManagedFields = nil
	wantSvc.Annotations = map[string]string{"example.com/mine": "x"}
	wantSlice := slice.DeepCopy()
	wantSlice.ManagedFields, wantSlice.OwnerReferences, wantSlice.GenerateName = nil, nil, ""
	wantSlice.Labels = map[string]string{discoveryv1.LabelServiceName: "web"}
	wantSlice.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-01-01T00:00:00Z"}
	wantSlice.Endpoints[0].Hostname, wantSlice.Endpoints[0].TargetRef, wantSlice.Endpoints[0].DeprecatedTopology = nil, nil, nil
	wantNode := node.DeepCopy()
	wantNode.ManagedFields = nil

	client := fake.NewClientset(svc, slice, node)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	svcFactory := NewServiceInformerFactory(client, 0)
	sliceFactory := NewEndpointSliceInformerFactory(client, 0)
	nodeFactory := NewNodeInformerFactory(client, "node-a", 0)
	informers := []cache.SharedIndexInformer{
		svcFactory.Core().V1().Services().Informer(),
		sliceFactory.Discovery().V1().EndpointSlices().Informer(),
		nodeFactory.Core().V1().Nodes().Informer(),
	}
	for _, f := range []interface{ Start(<-chan struct{}) }{svcFactory, sliceFactory, nodeFactory} {
		f.Start(ctx.Done())
	}
	defer func() {
		cancel() // before Shutdown, which waits for the informers to stop
		svcFactory.Shutdown()
		sliceFactory.Shutdown()
		nodeFactory.Shutdown()
	}()
	for _, inf := range informers {
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			t.Fatal("informers did not sync")
		}
	}
	for i, want := range []any{wantSvc, wantSlice, wantNode} {
		items := informers[i].GetStore().List()
		if len(items) != 1 {
			t.Fatalf("informer %d caches %d objects, want 1", i, len(items))
		}
		// The fake clientset sets the resource version, which the
		// objects above leave empty.
		got := items[0].(metav1.Object)
		got.SetResourceVersion("")
		if diff := cmp.Diff(want, items[0]); diff != "" {
			t.Errorf("cached object (-want +got):\n%s", diff)
		}
	}
}
