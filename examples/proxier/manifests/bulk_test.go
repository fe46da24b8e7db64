package manifests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// servicesYAML returns n Services, each with one EndpointSlice, named
// prefix-0 to prefix-n-1 in namespace ns.
func servicesYAML(prefix, ns string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `---
{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "%[1]s-%[3]d", "namespace": "%[2]s"},
 "spec": {"clusterIP": "10.96.%[4]d.%[5]d", "ports": [{"name": "p", "port": 80, "protocol": "TCP"}]}}
---
{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
 "metadata": {"name": "%[1]s-%[3]d-x", "namespace": "%[2]s", "labels": {"kubernetes.io/service-name": "%[1]s-%[3]d"}},
 "addressType": "IPv4", "endpoints": [{"addresses": ["10.128.%[4]d.%[5]d"]}],
 "ports": [{"name": "p", "port": 8080, "protocol": "TCP"}]}
`, prefix, ns, i, i>>8&255, i&255)
	}
	return b.String()
}

// serviceKeys returns the informer-store keys of servicesYAML's Services
// and of their slices.
func serviceKeys(prefix, ns string, n int) (svcs, slices []string) {
	for i := range n {
		svcs = append(svcs, fmt.Sprintf("%s/%s-%d", ns, prefix, i))
		slices = append(slices, fmt.Sprintf("%s/%s-%d-x", ns, prefix, i))
	}
	return sorted(svcs), sorted(slices)
}

// startInformers starts Service and EndpointSlice informers on src's
// client, logging through ctx's logger, and waits for their first list.
// They stop when the test ends.
func startInformers(ctx context.Context, t *testing.T, src *Source) (svcs, slices cache.SharedIndexInformer) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	factory := informers.NewSharedInformerFactory(src.Client(), 0)
	svcs = factory.Core().V1().Services().Informer()
	slices = factory.Discovery().V1().EndpointSlices().Informer()
	factory.StartWithContext(ctx)
	t.Cleanup(func() {
		cancel()
		factory.Shutdown()
	})
	if !cache.WaitForCacheSync(ctx.Done(), svcs.HasSynced, slices.HasSynced) {
		t.Fatal("informers did not sync")
	}
	return svcs, slices
}

// TestReloadBulkEdit applies one edit that adds 10,000 Services and their
// slices, then one that removes them all, while informers follow and a
// watch that nobody reads stays open. Before the store served watches
// itself, the fake's watches panicked with "channel full" 100 events into
// such an edit.
func TestReloadBulkEdit(t *testing.T) {
	const n = 10000
	dir := t.TempDir()
	small, bulk := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	write(t, small, servicesYAML("small", "one", 2))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src, problems, err := New(ctx, dir)
	if err != nil || len(problems) != 0 {
		t.Fatal(err, problems)
	}
	svcInformer, sliceInformer := startInformers(ctx, t, src)
	unread, err := src.Client().CoreV1().Services("").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer unread.Stop()

	converge := func(t *testing.T, wantSvcs, wantSlices []string) {
		t.Helper()
		keys := func(i cache.SharedIndexInformer) []string {
			return append([]string{}, sorted(i.GetStore().ListKeys())...)
		}
		err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			return cmp.Equal(wantSvcs, keys(svcInformer)) && cmp.Equal(wantSlices, keys(sliceInformer)), nil
		})
		if err != nil {
			t.Errorf("services (-want +got):\n%s", cmp.Diff(wantSvcs, keys(svcInformer)))
			t.Errorf("slices (-want +got):\n%s", cmp.Diff(wantSlices, keys(sliceInformer)))
		}
	}
	smallSvcs, smallSlices := serviceKeys("small", "one", 2)
	bulkSvcs, bulkSlices := serviceKeys("bulk", "two", n)

	write(t, bulk, servicesYAML("bulk", "two", n))
	if problems, err := src.Reload(ctx); err != nil || len(problems) != 0 {
		t.Fatal(err, problems)
	}
	converge(t, sorted(append(bulkSvcs, smallSvcs...)), sorted(append(bulkSlices, smallSlices...)))

	if err := os.Remove(bulk); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	converge(t, smallSvcs, smallSlices)

	if err := os.Remove(small); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	converge(t, []string{}, []string{})
}
