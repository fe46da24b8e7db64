package manifests

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
)

func service(ns, name string) *v1.Service {
	return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
}

// take reads n events from w as "TYPE ns/name@rv".
func take(t *testing.T, w watch.Interface, n int) []string {
	t.Helper()
	var out []string
	for range n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch closed after %v", out)
			}
			m, err := meta.Accessor(ev.Object)
			if err != nil {
				t.Fatal(err)
			}
			s := string(ev.Type) + " " + m.GetNamespace() + "/" + m.GetName() + "@" + m.GetResourceVersion()
			if ev.Type == watch.Bookmark {
				s += " " + m.GetAnnotations()[metav1.InitialEventsAnnotationKey]
			}
			out = append(out, s)
		case <-time.After(10 * time.Second):
			t.Fatalf("no event after %v", out)
		}
	}
	return out
}

// TestStoreWatch checks that watches start where an API server's would:
// after a List's resource version, from scratch, or as a streamed list.
func TestStoreWatch(t *testing.T) {
	ctx := context.Background()
	cs := newClientset()
	svcs := cs.CoreV1().Services("a")
	for _, name := range []string{"one", "two"} {
		if _, err := svcs.Create(ctx, service("a", name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	list, err := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff("2", list.ResourceVersion); diff != "" {
		t.Errorf("list resource version (-want +got):\n%s", diff)
	}
	// Changes after the List, a deletion among them, in another namespace
	// too.
	if _, err := svcs.Update(ctx, service("a", "one"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := svcs.Delete(ctx, "two", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Services("b").Create(ctx, service("b", "three"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		ns   string
		opts metav1.ListOptions
		want []string
	}{{
		name: "from the list",
		opts: metav1.ListOptions{ResourceVersion: list.ResourceVersion},
		want: []string{"MODIFIED a/one@3", "DELETED a/two@4", "ADDED b/three@5"},
	}, {
		name: "from the list, one namespace",
		ns:   "a",
		opts: metav1.ListOptions{ResourceVersion: list.ResourceVersion},
		want: []string{"MODIFIED a/one@3", "DELETED a/two@4"},
	}, {
		name: "from scratch",
		ns:   "a",
		want: []string{"ADDED a/one@3"},
	}, {
		name: "streamed list",
		opts: metav1.ListOptions{SendInitialEvents: ptr.To(true), ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan, AllowWatchBookmarks: true},
		want: []string{"ADDED a/one@3", "ADDED b/three@5", "BOOKMARK /@5 true"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := cs.CoreV1().Services(tc.ns).Watch(ctx, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			if diff := cmp.Diff(tc.want, take(t, w, len(tc.want))); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}

	for _, tc := range []struct {
		name string
		opts metav1.ListOptions
		is   func(error) bool
	}{
		{"newer than the last write", metav1.ListOptions{ResourceVersion: "6"}, isTooLargeResourceVersion},
		{"not a number", metav1.ListOptions{ResourceVersion: "x"}, apierrors.IsBadRequest},
		{"streamed list without NotOlderThan", metav1.ListOptions{SendInitialEvents: ptr.To(true), AllowWatchBookmarks: true}, apierrors.IsBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := cs.CoreV1().Services("").Watch(ctx, tc.opts)
			if !tc.is(err) {
				if w != nil {
					w.Stop()
				}
				t.Errorf("watch error = %v, want another", err)
			}
		})
	}
}

func isTooLargeResourceVersion(err error) bool {
	return apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge)
}

// TestStoreWatchHistory checks that a watch from a resource version the
// history no longer covers is refused with 410 Gone, so the reflector lists
// again instead of missing events.
func TestStoreWatchHistory(t *testing.T) {
	ctx := context.Background()
	cs := newClientset()
	cs.store.historySize = 3
	svcs := cs.CoreV1().Services("a")
	for i := range 5 {
		if _, err := svcs.Create(ctx, service("a", strconv.Itoa(i)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The history holds the writes of resource versions 3 to 5.
	if _, err := svcs.Watch(ctx, metav1.ListOptions{ResourceVersion: "1"}); !apierrors.IsResourceExpired(err) {
		t.Errorf("watch from 1: error %v, want 410 Gone", err)
	}
	w, err := svcs.Watch(ctx, metav1.ListOptions{ResourceVersion: "2"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if diff := cmp.Diff([]string{"ADDED a/2@3", "ADDED a/3@4", "ADDED a/4@5"}, take(t, w, 3)); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

// TestStoreWatchSlowReader checks that writes never wait for a watch's
// reader, and that a reader too far behind sees its watch end and can
// resume from the last resource version it saw without a gap.
func TestStoreWatchSlowReader(t *testing.T) {
	ctx := context.Background()
	cs := newClientset()
	cs.store.queueLimit = 4
	svcs := cs.CoreV1().Services("a")
	w, err := svcs.Watch(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	const n = 10
	for i := range n {
		if _, err := svcs.Create(ctx, service("a", strconv.Itoa(i)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	last := "0"
	for ev := range w.ResultChan() {
		m, _ := meta.Accessor(ev.Object)
		got = append(got, m.GetName())
		last = m.GetResourceVersion()
	}
	if len(got) > cs.store.queueLimit+1 { // the queue and the event in hand
		t.Errorf("the ended watch delivered %v, more than it holds", got)
	}
	resumed, err := svcs.Watch(ctx, metav1.ListOptions{ResourceVersion: last})
	if err != nil {
		t.Fatal(err)
	}
	defer resumed.Stop()
	for _, e := range take(t, resumed, n-len(got)) {
		name, _, _ := strings.Cut(strings.TrimPrefix(e, "ADDED a/"), "@")
		got = append(got, name)
	}
	want := []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("objects seen (-want +got):\n%s", diff)
	}
}

// TestStoreWrites checks the API server's rules for resource versions on
// writes.
func TestStoreWrites(t *testing.T) {
	ctx := context.Background()
	cs := newClientset()
	svcs := cs.CoreV1().Services("a")
	withRV := service("a", "x")
	withRV.ResourceVersion = "7"
	if _, err := svcs.Create(ctx, withRV, metav1.CreateOptions{}); !apierrors.IsBadRequest(err) {
		t.Errorf("create with a resource version: error %v, want bad request", err)
	}
	created, err := svcs.Create(ctx, service("a", "x"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svcs.Update(ctx, service("a", "x"), metav1.UpdateOptions{}); err != nil {
		t.Errorf("unconditional update: %v", err)
	}
	if _, err := svcs.Update(ctx, created, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Errorf("update from a stale resource version: error %v, want conflict", err)
	}
	got, err := svcs.Get(ctx, "x", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != "2" {
		t.Errorf("resource version after two writes = %q, want 2", got.ResourceVersion)
	}
}

// TestInformersStreamTheList checks that informers on the clientset use
// the watch-list protocol, as with an API server, instead of logging at
// -v=2 that their client "doesn't support WatchList semantics", a message
// that calls the --manifests mode not fit for production.
func TestInformersStreamTheList(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	write(t, path, clusterYAML)
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2), ktesting.BufferLogs(true)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	defer cancel()
	src, _, err := New(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	svcInformer, _ := startInformers(ctx, t, src)
	if diff := cmp.Diff([]string{"shop/web"}, svcInformer.GetStore().ListKeys()); diff != "" {
		t.Errorf("informer's services (-want +got):\n%s", diff)
	}
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	if strings.Contains(logs, "WatchList") {
		t.Errorf("the informer logged about WatchList:\n%s", logs)
	}
	var streamed bool
	for _, a := range src.client.Actions() {
		if w, ok := a.(clienttesting.WatchActionImpl); ok && w.GetResource().Resource == "services" {
			streamed = streamed || ptr.Deref(w.ListOptions.SendInitialEvents, false)
		}
	}
	if !streamed {
		t.Error("the informer did not stream its list: no watch of services with sendInitialEvents")
	}
}
