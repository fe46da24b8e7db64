package config

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
)

// cidrEvents records a ServiceCIDRHandler's calls.
type cidrEvents struct {
	mu     sync.Mutex
	events []string
}

func (e *cidrEvents) add(s string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.events = append(e.events, s)
}
func (e *cidrEvents) get() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.events...)
}
func (e *cidrEvents) OnServiceCIDRAdd(o *networkingv1.ServiceCIDR) { e.add("add " + o.Name) }
func (e *cidrEvents) OnServiceCIDRUpdate(_, o *networkingv1.ServiceCIDR) {
	e.add("update " + o.Name)
}
func (e *cidrEvents) OnServiceCIDRDelete(o *networkingv1.ServiceCIDR) { e.add("delete " + o.Name) }
func (e *cidrEvents) OnServiceCIDRsSynced()                           { e.add("synced") }

// TestServiceCIDRConfig checks that a ServiceCIDRConfig delivers the list
// and later events, and that its Run returns at once, with an error that
// is ErrServiceCIDRsUnavailable and the API's, when listing is refused;
// the objects still arrive once the list works.
func TestServiceCIDRConfig(t *testing.T) {
	gr := schema.GroupResource{Group: "networking.k8s.io", Resource: "servicecidrs"}
	for _, tc := range []struct {
		name   string
		refuse bool
	}{{"served", false}, {"refused at first", true}} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			client := fake.NewClientset(&networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
				Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16"}}})
			var refusing sync.Mutex
			refused := tc.refuse
			client.PrependReactor("list", "servicecidrs", func(clienttesting.Action) (bool, runtime.Object, error) {
				refusing.Lock()
				defer refusing.Unlock()
				if refused {
					return true, nil, apierrors.NewForbidden(gr, "", errors.New("RBAC"))
				}
				return false, nil, nil
			})
			factory := informers.NewSharedInformerFactory(client, 0)
			c, err := NewServiceCIDRConfig(ctx, factory.Networking().V1().ServiceCIDRs(), 0)
			if err != nil {
				t.Fatal(err)
			}
			h := &cidrEvents{}
			c.RegisterEventHandler(h)
			factory.Start(ctx.Done())
			// Shutdown waits for the informers, which stop with ctx.
			defer func() { cancel(); factory.Shutdown() }()
			err = c.Run(ctx)
			if tc.refuse {
				if !errors.Is(err, ErrServiceCIDRsUnavailable) || !apierrors.IsForbidden(err) {
					t.Fatalf("Run with the list refused: %v, want ErrServiceCIDRsUnavailable and Forbidden", err)
				}
				refusing.Lock()
				refused = false
				refusing.Unlock()
			} else if err != nil {
				t.Fatalf("Run: %v", err)
			}
			want := []string{"add kubernetes", "synced"}
			if tc.refuse {
				want = []string{"add kubernetes"} // no synced: Run did not see the list
			}
			deadline := time.Now().Add(20 * time.Second)
			for !cmp.Equal(h.get(), want) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if diff := cmp.Diff(want, h.get()); diff != "" {
				t.Fatalf("events after the list (-want +got):\n%s", diff)
			}
			if err := client.NetworkingV1().ServiceCIDRs().Delete(ctx, "kubernetes", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			want = append(want, "delete kubernetes")
			for !cmp.Equal(h.get(), want) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if diff := cmp.Diff(want, h.get()); diff != "" {
				t.Errorf("events after a deletion (-want +got):\n%s", diff)
			}
		})
	}
}
