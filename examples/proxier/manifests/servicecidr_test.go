package manifests

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

const serviceCIDRYAML = `apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: kubernetes, namespace: ignored}
spec:
  cidrs: [10.96.0.0/16, fd00:96::/112]
`

// TestServiceCIDRs checks that ServiceCIDRs load (cluster-scoped, whatever
// namespace the file gives), and that an edit and a removal reach a watch
// as MODIFIED and DELETED.
func TestServiceCIDRs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cidrs.yaml")
	write(t, path, serviceCIDRYAML)
	ctx := context.Background()
	src, problems, err := New(ctx, path)
	if err != nil || len(problems) != 0 {
		t.Fatalf("New: %v, problems %v", err, problems)
	}
	cidrs := src.Client().NetworkingV1().ServiceCIDRs()
	got, err := cidrs.Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"10.96.0.0/16", "fd00:96::/112"}, got.Spec.CIDRs); diff != "" || got.Namespace != "" {
		t.Errorf("loaded ServiceCIDR: namespace %q, cidrs (-want +got):\n%s", got.Namespace, diff)
	}
	w, err := cidrs.Watch(ctx, metav1.ListOptions{ResourceVersion: got.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	next := func() watch.EventType {
		t.Helper()
		select {
		case ev := <-w.ResultChan():
			if o, ok := ev.Object.(metav1.Object); !ok || o.GetName() != "kubernetes" {
				t.Fatalf("event %s of %T", ev.Type, ev.Object)
			}
			return ev.Type
		case <-time.After(10 * time.Second):
			t.Fatal("no watch event")
		}
		return ""
	}

	write(t, path, strings.Replace(serviceCIDRYAML, "[10.96.0.0/16, fd00:96::/112]", "[10.96.0.0/12]", 1))
	if _, err := src.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if typ := next(); typ != watch.Modified {
		t.Errorf("after an edit: %s, want MODIFIED", typ)
	}
	if got, err := cidrs.Get(ctx, "kubernetes", metav1.GetOptions{}); err != nil || !cmp.Equal(got.Spec.CIDRs, []string{"10.96.0.0/12"}) {
		t.Errorf("after an edit: %v, %v; want cidrs [10.96.0.0/12]", got, err)
	}
	write(t, path, "")
	if _, err := src.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if typ := next(); typ != watch.Deleted {
		t.Errorf("after the removal: %s, want DELETED", typ)
	}
}
