package proxier_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxy"
)

// cidrBackend records the service CIDRs of each family's last sync, and
// how many syncs each family had.
type cidrBackend struct {
	mu     sync.Mutex
	ranges map[v1.IPFamily][]string
	syncs  map[v1.IPFamily]int
	ports  map[v1.IPFamily]int
}

func newCIDRBackend() *cidrBackend {
	return &cidrBackend{ranges: map[v1.IPFamily][]string{}, syncs: map[v1.IPFamily]int{}, ports: map[v1.IPFamily]int{}}
}

func (b *cidrBackend) Sync(_ context.Context, ins []*proxy.FamilyInput) ([]proxy.SyncResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, in := range ins {
		var rs []string
		for _, p := range in.ServiceCIDRs {
			rs = append(rs, p.String())
		}
		b.ranges[in.Family] = rs
		b.syncs[in.Family]++
		b.ports[in.Family] = len(in.Services)
	}
	return make([]proxy.SyncResult, len(ins)), nil
}

func (b *cidrBackend) Run(ctx context.Context, lost func()) { <-ctx.Done() }
func (b *cidrBackend) state() (map[v1.IPFamily][]string, map[v1.IPFamily]int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := map[v1.IPFamily][]string{}
	for f, rs := range b.ranges {
		r[f] = slices.Clone(rs)
	}
	s := map[v1.IPFamily]int{}
	for f, n := range b.syncs {
		s[f] = n
	}
	return r, s
}

// perFamily makes one group, and one runner, per family of the node, all
// on b, so that a family synced is one that was asked for.
func perFamily(b proxy.Backend) proxier.NewBackendsFunc {
	return func(_ context.Context, node proxier.Node, _ *proxy.Metrics) ([]proxier.BackendGroup, error) {
		var gs []proxier.BackendGroup
		for _, f := range node.Families {
			gs = append(gs, proxier.BackendGroup{Backend: b, Families: []v1.IPFamily{f}})
		}
		return gs, nil
	}
}

func serviceCIDR(name string, cidrs ...string) *networkingv1.ServiceCIDR {
	return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
}

// TestProxierServiceCIDRs adds, updates and deletes ServiceCIDRs through a
// fake clientset and checks that each change reaches FamilyInput of its
// family, and of no other, and that objects the API server would refuse
// are logged by name and left out while the others apply.
func TestProxierServiceCIDRs(t *testing.T) {
	client := fake.NewClientset(testNode("192.168.0.1", "fd00::1"), testService("web", 80, "10.96.0.10"),
		serviceCIDR("kubernetes", "10.96.0.0/16", "fd00:96::/112"))
	b := newCIDRBackend()
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	startProxierIn(t, klog.NewContext(context.Background(), logger), client, perFamily(b), proxier.WithSyncPeriods(0, time.Hour))
	cidrs := client.NetworkingV1().ServiceCIDRs()

	want := func(step string, v4, v6 []string) {
		t.Helper()
		eventually(t, step, func() error {
			got, _ := b.state()
			if diff := cmp.Diff(map[v1.IPFamily][]string{v1.IPv4Protocol: v4, v1.IPv6Protocol: v6}, got); diff != "" {
				return fmt.Errorf("service CIDRs of the last syncs (-want +got):\n%s", diff)
			}
			return nil
		})
	}
	// onlyFamily checks that change, which changes family's ranges to
	// wantRanges, syncs that family and not the other.
	onlyFamily := func(step string, family v1.IPFamily, change func(), v4, v6 []string) {
		t.Helper()
		_, before := b.state()
		change()
		want(step, v4, v6)
		_, after := b.state()
		other := v1.IPv6Protocol
		if family == v1.IPv6Protocol {
			other = v1.IPv4Protocol
		}
		if after[family] == before[family] || after[other] != before[other] {
			t.Errorf("%s: syncs %v before, %v after; want %s's only", step, before, after, family)
		}
	}
	ctxAPI := context.Background()
	create := func(o *networkingv1.ServiceCIDR) func() {
		return func() {
			if _, err := cidrs.Create(ctxAPI, o, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}

	want("first sync", []string{"10.96.0.0/16"}, []string{"fd00:96::/112"})
	onlyFamily("a wider IPv4 range added", v1.IPv4Protocol, create(serviceCIDR("wider", "10.96.0.0/12")),
		[]string{"10.96.0.0/12", "10.96.0.0/16"}, []string{"fd00:96::/112"})
	onlyFamily("an IPv6 range added", v1.IPv6Protocol, create(serviceCIDR("more-v6", "fd00:97::/112")),
		[]string{"10.96.0.0/12", "10.96.0.0/16"}, []string{"fd00:96::/112", "fd00:97::/112"})
	onlyFamily("the same IPv4 range in another object, and a non-canonical one", v1.IPv4Protocol, func() {
		create(serviceCIDR("again", "10.96.0.0/16"))()
		create(serviceCIDR("sloppy", "010.098.0.1/16"))()
	}, []string{"10.96.0.0/12", "10.96.0.0/16", "10.98.0.0/16"}, []string{"fd00:96::/112", "fd00:97::/112"})

	// Objects the API server refuses, then one good one: only the good
	// one applies, and each bad one is logged by name.
	bad := []*networkingv1.ServiceCIDR{
		serviceCIDR("empty"),
		serviceCIDR("junk", "10.200.0.0/16; drop", "fd00:200::/112"),
		serviceCIDR("no-length", "10.201.0.0"),
		serviceCIDR("same-family", "10.202.0.0/16", "10.203.0.0/16"),
		serviceCIDR("three", "10.204.0.0/16", "fd00:204::/112", "10.205.0.0/16"),
	}
	onlyFamily("bad objects skipped, a good one kept", v1.IPv4Protocol, func() {
		for _, o := range bad {
			create(o)()
		}
		create(serviceCIDR("good", "10.99.0.0/16"))()
	}, []string{"10.96.0.0/12", "10.96.0.0/16", "10.98.0.0/16", "10.99.0.0/16"}, []string{"fd00:96::/112", "fd00:97::/112"})
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	for _, o := range bad {
		if !strings.Contains(logs, "Ignoring a ServiceCIDR the API server would refuse") || !strings.Contains(logs, `serviceCIDR="`+o.Name+`"`) {
			t.Errorf("no log names the refused ServiceCIDR %s", o.Name)
		}
	}

	// A change of metadata only changes no range: no sync. Then a
	// deletion, whose sync proves the update's would have come first.
	_, before := b.state()
	o, err := cidrs.Get(ctxAPI, "wider", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	o.Labels = map[string]string{"x": "y"}
	if _, err := cidrs.Update(ctxAPI, o, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cidrs.Delete(ctxAPI, "wider", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want("the wider range deleted", []string{"10.96.0.0/16", "10.98.0.0/16", "10.99.0.0/16"}, []string{"fd00:96::/112", "fd00:97::/112"})
	if _, after := b.state(); after[v1.IPv4Protocol] != before[v1.IPv4Protocol]+1 || after[v1.IPv6Protocol] != before[v1.IPv6Protocol] {
		t.Errorf("a label change and a deletion: syncs %v before, %v after; want one IPv4 sync", before, after)
	}

	onlyFamily("the dual-stack object deleted", v1.IPv6Protocol, func() {
		// Its IPv4 range is in "again" too.
		if err := cidrs.Delete(ctxAPI, "kubernetes", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}, []string{"10.96.0.0/16", "10.98.0.0/16", "10.99.0.0/16"}, []string{"fd00:97::/112"})
}

// TestProxierWithoutServiceCIDRs runs the Proxier once against API
// servers that refuse to list ServiceCIDRs (an old one: 404; RBAC: 403):
// it does not wait for them and syncs the services without ranges. With
// them served, the one sync has them.
func TestProxierWithoutServiceCIDRs(t *testing.T) {
	gr := schema.GroupResource{Group: "networking.k8s.io", Resource: "servicecidrs"}
	for _, tc := range []struct {
		name string
		err  error
		want []string
	}{
		{"served", nil, []string{"10.96.0.0/16"}},
		{"not served", apierrors.NewNotFound(gr, ""), nil},
		{"forbidden", apierrors.NewForbidden(gr, "", fmt.Errorf("RBAC")), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(testNode("192.168.0.1"), testService("web", 80, "10.96.0.10"),
				serviceCIDR("kubernetes", "10.96.0.0/16"))
			if tc.err != nil {
				client.PrependReactor("list", "servicecidrs", func(clienttesting.Action) (bool, runtime.Object, error) {
					return true, nil, tc.err
				})
				client.PrependWatchReactor("servicecidrs", func(clienttesting.Action) (bool, watch.Interface, error) {
					return true, nil, tc.err
				})
			}
			b := newCIDRBackend()
			_, ctx := ktesting.NewTestContext(t)
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			p, err := proxier.New(client, "node-a", perFamily(b))
			if err != nil {
				t.Fatal(err)
			}
			if err := p.RunOnce(ctx); err != nil {
				t.Fatalf("RunOnce: %v", err)
			}
			got, syncs := b.state()
			if syncs[v1.IPv4Protocol] != 1 || b.ports[v1.IPv4Protocol] != 1 {
				t.Errorf("%d syncs of %d service ports, want 1 of 1", syncs[v1.IPv4Protocol], b.ports[v1.IPv4Protocol])
			}
			if diff := cmp.Diff(tc.want, got[v1.IPv4Protocol]); diff != "" {
				t.Errorf("service CIDRs (-want +got):\n%s", diff)
			}
		})
	}
}
