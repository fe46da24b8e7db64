package proxier_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxy"
)

// TestProxierRefusesNodeAddressAsClusterIP checks that the Proxier's
// trackers know the node's addresses: a Service whose cluster IP is one
// of them, in either family, reaches no Backend, while the others do.
func TestProxierRefusesNodeAddressAsClusterIP(t *testing.T) {
	client := fake.NewClientset(testNode("192.168.0.1", "fd00::1"),
		testService("good", 80, "10.96.0.10", "fd00:96::10"),
		testService("own4", 22, "192.168.0.1"),
		testService("own6", 22, "10.96.0.11", "fd00::1"))
	b := newRecordingBackend()
	oneGroup := func(_ context.Context, node proxier.Node, _ *proxy.Metrics) ([]proxier.BackendGroup, error) {
		return []proxier.BackendGroup{{Backend: b, Families: node.Families}}, nil
	}
	startProxier(t, client, oneGroup, proxier.WithSyncPeriods(0, time.Hour))
	want := state{
		v1.IPv4Protocol: {"ns/good:p 10.96.0.10:80/TCP": {}},
		v1.IPv6Protocol: {"ns/good:p [fd00:96::10]:80/TCP": {}},
	}
	eventually(t, "the first sync", func() error {
		st, _, _ := b.snapshot()
		if diff := cmp.Diff(want, st); diff != "" {
			return fmt.Errorf("backend state (-want +got):\n%s", diff)
		}
		return nil
	})
}
