package proxier_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxy"
)

// TestProxierFollowsPodCIDRs checks that the Node's spec.podCIDRs reach
// the Backend, each family's in its input: none before they are
// allocated, then the family's (a bad one left out) with Full set, and a
// later sync for another change is not full for them.
func TestProxierFollowsPodCIDRs(t *testing.T) {
	client := fake.NewClientset(testNode("192.168.0.1", "fd00::1"), testService("web", 80, "10.96.0.10"))
	b := newRecordingBackend()
	startProxier(t, client, func(_ context.Context, node proxier.Node, _ *proxy.Metrics) ([]proxier.BackendGroup, error) {
		return []proxier.BackendGroup{{Backend: b, Families: node.Families}}, nil
	}, proxier.WithSyncPeriods(0, time.Hour))
	type input struct {
		PodCIDRs map[v1.IPFamily][]netip.Prefix
		Full     bool
		Ports    int
	}
	// fulls is how many good syncs were full so far. A check asks
	// whether one was since a mark, not whether the last one was: a
	// partial sync may follow the full one before the check looks.
	fulls := func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.full
	}
	since := 0
	want := func(what string, w input) {
		t.Helper()
		eventually(t, what, func() error {
			b.mu.Lock()
			defer b.mu.Unlock()
			got := input{PodCIDRs: map[v1.IPFamily][]netip.Prefix{}, Full: b.full > since}
			for _, in := range b.inputs {
				got.PodCIDRs[in.Family] = in.PodCIDRs
				got.Ports += len(in.Services)
			}
			if diff := cmp.Diff(w, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				return fmt.Errorf("inputs (-want +got):\n%s", diff)
			}
			return nil
		})
	}
	none := map[v1.IPFamily][]netip.Prefix{v1.IPv4Protocol: nil, v1.IPv6Protocol: nil}
	want("the first sync, before the range is allocated", input{PodCIDRs: none, Full: true, Ports: 1})

	ctx := context.Background()
	since = fulls()
	node := testNode("192.168.0.1", "fd00::1")
	node.Spec.PodCIDRs = []string{"10.244.1.7/24", "fd00:244:1::/64", "bad"}
	if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	allocated := map[v1.IPFamily][]netip.Prefix{
		v1.IPv4Protocol: {netip.MustParsePrefix("10.244.1.0/24")},
		v1.IPv6Protocol: {netip.MustParsePrefix("fd00:244:1::/64")},
	}
	want("the sync after the range was allocated", input{PodCIDRs: allocated, Full: true, Ports: 1})

	since = fulls()
	if _, err := client.CoreV1().Services("ns").Create(ctx, testService("other", 80, "10.96.0.11"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("the sync after a new Service", input{PodCIDRs: allocated, Ports: 2})
}
