package proxier_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxy"
)

// openListeners is a listen func that opens idle listeners and records the
// addresses listened on now.
type openListeners struct {
	mu   sync.Mutex
	open map[string]int
}

func (o *openListeners) listen(_ context.Context, _, address string) (net.Listener, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.open[address]++
	return &recordedListener{o: o, addr: address, closed: make(chan struct{})}, nil
}

func (o *openListeners) addresses() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for a, n := range o.open {
		if n > 0 {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return out
}

type recordedListener struct {
	o      *openListeners
	addr   string
	once   sync.Once
	closed chan struct{}
}

func (l *recordedListener) Accept() (net.Conn, error) { <-l.closed; return nil, net.ErrClosed }
func (l *recordedListener) Addr() net.Addr            { return &net.TCPAddr{} }
func (l *recordedListener) Close() error {
	l.once.Do(func() {
		close(l.closed)
		l.o.mu.Lock()
		defer l.o.mu.Unlock()
		l.o.open[l.addr]--
	})
	return nil
}

// TestServiceHealthFollowsNodeAddresses checks that the health-check node
// port of a Service with externalTrafficPolicy Local, listened on the
// node's own addresses, moves to the new address when the Node's
// InternalIP changes, without a restart, and that the node ports' input
// changes with it.
func TestServiceHealthFollowsNodeAddresses(t *testing.T) {
	svc := testService("web", 80, "10.96.0.10")
	svc.Spec.Type = v1.ServiceTypeLoadBalancer
	svc.Spec.Ports[0].NodePort = 30080
	svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	svc.Spec.HealthCheckNodePort = 30000
	client := fake.NewClientset(testNode("192.168.0.1"), svc)
	ol := &openListeners{open: map[string]int{}}
	b := newRecordingBackend()
	startProxier(t, client, func(_ context.Context, node proxier.Node, _ *proxy.Metrics) ([]proxier.BackendGroup, error) {
		return []proxier.BackendGroup{{Backend: b, Families: node.Families[:1]}}, nil
	}, proxier.WithSyncPeriods(0, time.Hour), proxier.WithListenFunc(ol.listen),
		proxier.WithServiceHealthServer(func(n proxier.Node) []netip.Addr { return n.IPs[v1.IPv4Protocol] }))
	want := func(what string, addrs ...string) {
		t.Helper()
		eventually(t, what, func() error {
			if diff := cmp.Diff(addrs, ol.addresses()); diff != "" {
				return fmt.Errorf("listening on (-want +got):\n%s", diff)
			}
			return nil
		})
	}
	want("at start", "192.168.0.1:30000")
	if _, err := client.CoreV1().Nodes().Update(context.Background(), testNode("192.168.0.2"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("after the InternalIP changed", "192.168.0.2:30000")
	if _, err := client.CoreV1().Nodes().Update(context.Background(), testNode("192.168.0.2", "192.168.0.3"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want("after an address was added", "192.168.0.2:30000", "192.168.0.3:30000")
}

// TestNodeFamilies checks the families a NewBackendsFunc is offered, as
// kube-proxy offers them to its proxiers: both, whatever the Node lists,
// the primary (that of the first address) first, and IPv4 first when
// neither the Node nor the host gives an address.
func TestNodeFamilies(t *testing.T) {
	v4v6 := []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
	v6v4 := []v1.IPFamily{v1.IPv6Protocol, v1.IPv4Protocol}
	for _, tc := range []struct {
		name    string
		node    *v1.Node
		host    []string
		want    []v1.IPFamily
		wantIPs map[v1.IPFamily][]netip.Addr
	}{
		{"IPv4 only", testNode("192.168.0.1"), nil, v4v6,
			map[v1.IPFamily][]netip.Addr{v1.IPv4Protocol: {netip.MustParseAddr("192.168.0.1")}}},
		{"IPv6 only", testNode("fd00::1"), nil, v6v4,
			map[v1.IPFamily][]netip.Addr{v1.IPv6Protocol: {netip.MustParseAddr("fd00::1")}}},
		{"IPv6 first", testNode("fd00::1", "192.168.0.1"), nil, v6v4,
			map[v1.IPFamily][]netip.Addr{v1.IPv4Protocol: {netip.MustParseAddr("192.168.0.1")}, v1.IPv6Protocol: {netip.MustParseAddr("fd00::1")}}},
		{"no Node, the host's IPv6 first", nil, []string{"fd00::9", "10.0.0.9"}, v6v4,
			map[v1.IPFamily][]netip.Addr{v1.IPv4Protocol: {netip.MustParseAddr("10.0.0.9")}, v1.IPv6Protocol: {netip.MustParseAddr("fd00::9")}}},
		{"no address anywhere", testNode(), nil, v4v6, map[v1.IPFamily][]netip.Addr{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			if tc.node != nil {
				client = fake.NewClientset(tc.node)
			}
			got := make(chan proxier.Node, 1)
			p, err := proxier.New(client, "node-a", func(_ context.Context, node proxier.Node, _ *proxy.Metrics) ([]proxier.BackendGroup, error) {
				got <- node
				return []proxier.BackendGroup{{Backend: newRecordingBackend(), Families: node.Families}}, nil
			}, proxier.WithHostAddresses(func() ([]netip.Addr, error) {
				var out []netip.Addr
				for _, a := range tc.host {
					out = append(out, netip.MustParseAddr(a))
				}
				return out, nil
			}))
			if err != nil {
				t.Fatal(err)
			}
			if err := p.RunOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
			n := <-got
			if diff := cmp.Diff(tc.want, n.Families); diff != "" {
				t.Errorf("Families (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantIPs, n.IPs, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("IPs (-want +got):\n%s", diff)
			}
		})
	}
}
