package manifests

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/proxier/config"
)

// kubeProxySelector is the label selector kube-proxy lists and watches
// both Services and EndpointSlices with.
const kubeProxySelector = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"

func labelled(svc *v1.Service, lbls map[string]string, clusterIP string) *v1.Service {
	svc.Labels = lbls
	svc.Spec.ClusterIP = clusterIP
	return svc
}

// TestStoreListSelectors checks that lists apply label and field selectors
// as an API server does, with the selectors kube-proxy and this module's
// proxier use.
func TestStoreListSelectors(t *testing.T) {
	ctx := context.Background()
	cs := newClientset()
	for _, svc := range []*v1.Service{
		labelled(service("a", "plain"), nil, "10.96.0.1"),
		labelled(service("a", "other-proxy"), map[string]string{config.ServiceProxyNameLabel: "other"}, "10.96.0.2"),
		labelled(service("a", "headless"), map[string]string{v1.IsHeadlessService: ""}, v1.ClusterIPNone),
		labelled(service("a", "headless-label"), map[string]string{v1.IsHeadlessService: ""}, "10.96.0.3"),
		labelled(service("b", "mine"), map[string]string{config.ServiceProxyNameLabel: "mine"}, "10.96.0.4"),
	} {
		if _, err := cs.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, slice := range []*discoveryv1.EndpointSlice{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "plain-1", Labels: map[string]string{discoveryv1.LabelServiceName: "plain"}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "headless-1", Labels: map[string]string{discoveryv1.LabelServiceName: "headless", v1.IsHeadlessService: ""}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "other-1", Labels: map[string]string{discoveryv1.LabelServiceName: "other-proxy", config.ServiceProxyNameLabel: "other"}}},
	} {
		if _, err := cs.DiscoveryV1().EndpointSlices(slice.Namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"node-a", "node-b"} {
		if _, err := cs.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	serviceNames := func(opts metav1.ListOptions) []string {
		list, err := cs.store.List(servicesResource, v1.SchemeGroupVersion.WithKind("Service"), "", opts)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range list.(*v1.ServiceList).Items {
			out = append(out, s.Namespace+"/"+s.Name)
		}
		slices.Sort(out)
		return out
	}
	for _, tc := range []struct {
		name string
		opts metav1.ListOptions
		want []string
	}{{
		name: "kube-proxy's",
		opts: metav1.ListOptions{LabelSelector: kubeProxySelector},
		want: []string{"a/plain"},
	}, {
		name: "this module's default proxier",
		opts: metav1.ListOptions{LabelSelector: config.ServiceLabelSelector("").String(), FieldSelector: config.ServiceFieldSelector().String()},
		want: []string{"a/headless-label", "a/plain"},
	}, {
		name: "a proxier named mine",
		opts: metav1.ListOptions{LabelSelector: config.ServiceLabelSelector("mine").String(), FieldSelector: config.ServiceFieldSelector().String()},
		want: []string{"b/mine"},
	}, {
		name: "by namespace and type, which the API server defaults",
		opts: metav1.ListOptions{FieldSelector: "metadata.namespace=a,spec.type=ClusterIP,metadata.name!=plain"},
		want: []string{"a/headless", "a/headless-label", "a/other-proxy"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, serviceNames(tc.opts)); diff != "" {
				t.Errorf("services (-want +got):\n%s", diff)
			}
			// The typed client, as informers call it, agrees.
			list, err := cs.CoreV1().Services("").List(ctx, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(list.Items) != len(tc.want) {
				t.Errorf("the typed client listed %d services, want %d", len(list.Items), len(tc.want))
			}
		})
	}

	sliceList, err := cs.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{LabelSelector: config.EndpointSliceLabelSelector().String()})
	if err != nil {
		t.Fatal(err)
	}
	var gotSlices []string
	for _, s := range sliceList.Items {
		gotSlices = append(gotSlices, s.Name)
	}
	slices.Sort(gotSlices)
	// A slice carrying the service-proxy-name label is the proxier's
	// whenever its Service is: only the headless label leaves it out.
	if diff := cmp.Diff([]string{"other-1", "plain-1"}, gotSlices); diff != "" {
		t.Errorf("endpoint slices (-want +got):\n%s", diff)
	}

	nodeList, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector(metav1.ObjectNameField, "node-b").String()})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodeList.Items) != 1 || nodeList.Items[0].Name != "node-b" {
		t.Errorf("nodes selected by name: %v, want node-b alone", nodeList.Items)
	}

	// Fields the API server cannot select by are a bad request, for lists
	// and watches alike.
	for _, tc := range []struct {
		resource string
		selector string
	}{
		{"services", "spec.externalName=x"},
		{"endpointslices", "addressType=IPv4"},
		{"nodes", "metadata.namespace=a"},
	} {
		gvr := servicesResource.GroupResource().WithVersion("v1")
		switch tc.resource {
		case "endpointslices":
			gvr = discoveryv1.SchemeGroupVersion.WithResource("endpointslices")
		case "nodes":
			gvr = v1.SchemeGroupVersion.WithResource("nodes")
		}
		opts := metav1.ListOptions{FieldSelector: tc.selector}
		if _, err := cs.store.List(gvr, v1.SchemeGroupVersion.WithKind("Service"), "", opts); !apierrors.IsBadRequest(err) {
			t.Errorf("list %s with %q: error %v, want bad request", tc.resource, tc.selector, err)
		}
		if w, err := cs.store.Watch(gvr, "", opts); !apierrors.IsBadRequest(err) {
			if w != nil {
				w.Stop()
			}
			t.Errorf("watch %s with %q: error %v, want bad request", tc.resource, tc.selector, err)
		}
	}
}

var servicesResource = v1.SchemeGroupVersion.WithResource("services")

// TestStoreWatchSelectorTransitions checks that a watch with a selector
// sees an object that a change takes out of its selection as DELETED and
// one that a change brings in as ADDED, as from an API server's watch
// cache: live, resumed from the history, and in a streamed list.
func TestStoreWatchSelectorTransitions(t *testing.T) {
	ctx := context.Background()
	cs := newClientset()
	svcs := cs.CoreV1().Services("a")
	sel := metav1.ListOptions{LabelSelector: kubeProxySelector, FieldSelector: config.ServiceFieldSelector().String()}
	live := sel
	live.ResourceVersion = "0"
	w, err := svcs.Watch(ctx, live)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	web := labelled(service("a", "web"), nil, "10.96.0.1")
	other := labelled(service("a", "other"), map[string]string{config.ServiceProxyNameLabel: "x"}, "10.96.0.2")
	steps := []func() error{
		func() error { _, err := svcs.Create(ctx, web.DeepCopy(), metav1.CreateOptions{}); return err },   // 1: ADDED
		func() error { _, err := svcs.Create(ctx, other.DeepCopy(), metav1.CreateOptions{}); return err }, // 2: not selected
		func() error { // 3: leaves: DELETED
			s := labelled(web.DeepCopy(), map[string]string{config.ServiceProxyNameLabel: "x"}, "10.96.0.1")
			_, err := svcs.Update(ctx, s, metav1.UpdateOptions{})
			return err
		},
		func() error { // 4: stays out: nothing
			s := labelled(web.DeepCopy(), map[string]string{config.ServiceProxyNameLabel: "y"}, "10.96.0.1")
			_, err := svcs.Update(ctx, s, metav1.UpdateOptions{})
			return err
		},
		func() error { // 5: comes back: ADDED
			_, err := svcs.Update(ctx, web.DeepCopy(), metav1.UpdateOptions{})
			return err
		},
		func() error { // 6: becomes headless by label: DELETED
			s := labelled(web.DeepCopy(), map[string]string{v1.IsHeadlessService: ""}, "10.96.0.1")
			_, err := svcs.Update(ctx, s, metav1.UpdateOptions{})
			return err
		},
		func() error { // 7: the label goes again: ADDED
			_, err := svcs.Update(ctx, web.DeepCopy(), metav1.UpdateOptions{})
			return err
		},
		func() error { // 8: a change within the selection: MODIFIED
			s := web.DeepCopy()
			s.Spec.Ports = []v1.ServicePort{{Port: 80}}
			_, err := svcs.Update(ctx, s, metav1.UpdateOptions{})
			return err
		},
		func() error { return svcs.Delete(ctx, "other", metav1.DeleteOptions{}) }, // 9: not selected
		func() error { return svcs.Delete(ctx, "web", metav1.DeleteOptions{}) },   // 10: DELETED
	}
	for i, step := range steps {
		if err := step(); err != nil {
			t.Fatalf("step %d: %v", i+1, err)
		}
	}
	// The DELETED event of a Service that leaves carries its state before
	// the change (no label) at the change's resource version.
	want := []string{"ADDED a/web@1", "DELETED a/web@3", "ADDED a/web@5", "DELETED a/web@6", "ADDED a/web@7", "MODIFIED a/web@8", "DELETED a/web@10"}
	got := take(t, w, len(want))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("live events (-want +got):\n%s", diff)
	}

	resumed := sel
	resumed.ResourceVersion = "2"
	r, err := svcs.Watch(ctx, resumed)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Stop()
	if diff := cmp.Diff(want[1:], take(t, r, len(want)-1)); diff != "" {
		t.Errorf("events resumed from resource version 2 (-want +got):\n%s", diff)
	}
	again, err := svcs.Watch(ctx, resumed)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Stop()
	select {
	case ev := <-again.ResultChan():
		if svc, ok := ev.Object.(*v1.Service); !ok || ev.Type != watch.Deleted || len(svc.Labels) != 0 {
			t.Errorf("the event of web leaving is %s %v, want DELETED with its labels before the change (none)", ev.Type, ev.Object)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
	}

	// A Service in the selection, and one out of it, in a streamed list.
	if _, err := svcs.Create(ctx, web.DeepCopy(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := svcs.Create(ctx, other.DeepCopy(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	streamed := sel
	streamed.SendInitialEvents = ptr.To(true)
	streamed.ResourceVersionMatch = metav1.ResourceVersionMatchNotOlderThan
	streamed.AllowWatchBookmarks = true
	s, err := svcs.Watch(ctx, streamed)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if diff := cmp.Diff([]string{"ADDED a/web@11", "BOOKMARK /@12 true"}, take(t, s, 2)); diff != "" {
		t.Errorf("streamed list (-want +got):\n%s", diff)
	}
}
