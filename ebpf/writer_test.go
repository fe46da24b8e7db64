package ebpf_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/ebpf/ebpftest"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/proxy"
	"github.com/proxykit/proxykit/proxy/proxytest"
)

// fakeBackend is the smallest proxy.Backend over the writer, for the
// conformance suite: one writer per family over one fake each.
type fakeBackend struct {
	mu      sync.Mutex
	writers map[v1.IPFamily]*ebpf.Writer
	fakes   map[v1.IPFamily]*ebpftest.Fake
}

func (b *fakeBackend) Sync(ctx context.Context, ins []*proxy.FamilyInput) ([]proxy.SyncResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []proxy.SyncResult
	var errs []error
	if len(ins) != len(b.writers) {
		return make([]proxy.SyncResult, len(ins)), fmt.Errorf("%d inputs for %d families", len(ins), len(b.writers))
	}
	for _, in := range ins {
		w := b.writers[in.Family]
		if w == nil {
			out = append(out, proxy.SyncResult{})
			errs = append(errs, fmt.Errorf("no writer of %s", in.Family))
			continue
		}
		r, err := w.Sync(ctx, in)
		out = append(out, r.Proxy())
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}

func (b *fakeBackend) Run(ctx context.Context, lost func()) {}

func (b *fakeBackend) dump() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out strings.Builder
	for _, f := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		if fk := b.fakes[f]; fk != nil {
			out.WriteString(ebpftest.Routes(fk.State()))
		}
	}
	return out.String()
}

func TestWriterConformance(t *testing.T) {
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		t.Run(string(family), proxytest.Suite{
			Families: []v1.IPFamily{family},
			New: func(t testing.TB, node proxy.NodeConfig) (proxy.Backend, proxytest.Datapath) {
				fk := ebpftest.NewFake(family, ebpf.Sizes{})
				w, err := ebpf.NewWriter(fk, ebpf.WriterConfig{Family: family, Node: node})
				if err != nil {
					t.Fatal(err)
				}
				b := &fakeBackend{writers: map[v1.IPFamily]*ebpf.Writer{family: w}, fakes: map[v1.IPFamily]*ebpftest.Fake{family: fk}}
				return b, proxytest.Datapath{
					Dump: b.dump,
					FailNextApply: func() {
						b.mu.Lock()
						defer b.mu.Unlock()
						fk.FailNext = errors.New("injected failure")
					},
					Wipe: func() {
						b.mu.Lock()
						defer b.mu.Unlock()
						*fk.State() = *ebpf.NewState()
					},
				}
			},
		}.Run)
	}
}

func newWriter(t *testing.T, family v1.IPFamily, sizes ebpf.Sizes, node proxy.NodeConfig) (*ebpf.Writer, *ebpftest.Fake) {
	t.Helper()
	fk := ebpftest.NewFake(family, sizes)
	node.Name = writertest.Node
	w, err := ebpf.NewWriter(fk, ebpf.WriterConfig{Family: family, Node: node})
	if err != nil {
		t.Fatal(err)
	}
	return w, fk
}

func mustSync(t *testing.T, w *ebpf.Writer, c *writertest.Cluster) ebpf.SyncResult {
	t.Helper()
	r, err := w.Sync(context.Background(), c.Input())
	if err != nil {
		t.Fatalf("Sync: %v", err)
	}
	return r
}

func endpoints(n int) []writertest.Endpoint {
	var eps []writertest.Endpoint
	for i := range n {
		eps = append(eps, writertest.Endpoint{IP: netip.AddrFrom4([4]byte{10, 0, 1, byte(i + 1)}).String(), Node: "node-b"})
	}
	return eps
}

func trace(fk *ebpftest.Fake, dst string, proto v1.Protocol) []string {
	ap := netip.MustParseAddrPort(dst)
	var out []string
	for _, o := range fk.Trace(ebpftest.Connection{Destination: ebpf.Frontend{Addr: ap.Addr(), Port: ap.Port(), Protocol: proto}}) {
		out = append(out, o.String())
	}
	return out
}

// TestWriterFrontends checks which addresses a Service is served on and
// where each sends.
func TestWriterFrontends(t *testing.T) {
	w, fk := newWriter(t, v1.IPv4Protocol, ebpf.Sizes{}, proxy.NodeConfig{})
	c := writertest.NewCluster(v1.IPv4Protocol, writertest.Node)
	c.NodeIPs = []netip.Addr{netip.MustParseAddr("192.168.0.1")}
	c.SetService(writertest.Service("ns", "web", "10.96.0.10",
		writertest.WithExternalIPs("203.0.113.1"), writertest.WithLoadBalancer("198.51.100.1"), writertest.WithNodePort(30080), writertest.WithAffinity(60)))
	c.SetEndpoints("ns", "web", writertest.TCP8080, endpoints(2)...)
	c.SetService(writertest.Service("ns", "ranged", "10.96.0.11", writertest.WithLoadBalancer("198.51.100.2", "192.0.2.0/24")))
	c.SetEndpoints("ns", "ranged", writertest.TCP8080, endpoints(1)...)
	c.SetService(writertest.Service("ns", "empty", "10.96.0.12"))
	mustSync(t, w, c)
	want := `10.96.0.10:80/TCP flags=0 affinity=60: 10.0.1.1:8080*1 10.0.1.2:8080*1
10.96.0.11:80/TCP flags=0 affinity=0: 10.0.1.1:8080*1
10.96.0.12:80/TCP flags=0 affinity=0: refused
192.168.0.1:30080/TCP flags=4 affinity=60: 10.0.1.1:8080*1 10.0.1.2:8080*1
198.51.100.1:80/TCP flags=2 affinity=60: 10.0.1.1:8080*1 10.0.1.2:8080*1
203.0.113.1:80/TCP flags=1 affinity=60: 10.0.1.1:8080*1 10.0.1.2:8080*1
`
	if diff := cmp.Diff(want, ebpftest.Routes(fk.State())); diff != "" {
		t.Errorf("routes (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"-> 10.0.1.1:8080 (p=0.5)", "-> 10.0.1.2:8080 (p=0.5)"}, trace(fk, "10.96.0.10:80", v1.ProtocolTCP)); diff != "" {
		t.Errorf("trace (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"pass"}, trace(fk, "10.96.0.10:80", v1.ProtocolUDP)); diff != "" {
		t.Errorf("trace of another protocol (-want +got):\n%s", diff)
	}
}

// TestWriterPolicies checks the sets each frontend kind sends to under
// the traffic policies.
func TestWriterPolicies(t *testing.T) {
	local := writertest.Endpoint{IP: "10.0.0.5", Node: writertest.Node}
	remote := writertest.Endpoint{IP: "10.0.1.5", Node: "node-b"}
	for _, tc := range []struct {
		name string
		opts []writertest.ServiceOption
		want string
	}{{
		name: "internal local, external cluster",
		opts: []writertest.ServiceOption{writertest.WithInternalLocal(), writertest.WithNodePort(30080)},
		want: `10.96.0.10:80/TCP flags=0 affinity=0: 10.0.0.5:8080*1
192.168.0.1:30080/TCP flags=4 affinity=0: 10.0.0.5:8080*1 10.0.1.5:8080*1
`,
	}, {
		name: "external local short-circuits node traffic to cluster endpoints",
		opts: []writertest.ServiceOption{writertest.WithNodePort(30080), writertest.WithExternalLocal()},
		want: `10.96.0.10:80/TCP flags=0 affinity=0: 10.0.0.5:8080*1 10.0.1.5:8080*1
192.168.0.1:30080/TCP flags=4 affinity=0: 10.0.0.5:8080*1 10.0.1.5:8080*1
`,
	}, {
		name: "both local",
		opts: []writertest.ServiceOption{writertest.WithInternalLocal(), writertest.WithNodePort(30080), writertest.WithExternalLocal()},
		want: `10.96.0.10:80/TCP flags=0 affinity=0: 10.0.0.5:8080*1
192.168.0.1:30080/TCP flags=4 affinity=0: 10.0.0.5:8080*1 10.0.1.5:8080*1
`,
	}, {
		name: "internal local without external addresses",
		opts: []writertest.ServiceOption{writertest.WithInternalLocal()},
		want: "10.96.0.10:80/TCP flags=0 affinity=0: 10.0.0.5:8080*1\n",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			w, fk := newWriter(t, v1.IPv4Protocol, ebpf.Sizes{}, proxy.NodeConfig{})
			c := writertest.NewCluster(v1.IPv4Protocol, writertest.Node)
			c.NodeIPs = []netip.Addr{netip.MustParseAddr("192.168.0.1")}
			c.SetService(writertest.Service("ns", "web", "10.96.0.10", tc.opts...))
			c.SetEndpoints("ns", "web", writertest.TCP8080, local, remote)
			mustSync(t, w, c)
			if diff := cmp.Diff(tc.want, ebpftest.Routes(fk.State())); diff != "" {
				t.Errorf("routes (-want +got):\n%s", diff)
			}
		})
	}
}

// TestWriterOneEndpointChange checks that removing or adding one endpoint
// is a few element writes, and that the result is the full sync's.
func TestWriterOneEndpointChange(t *testing.T) {
	w, fk := newWriter(t, v1.IPv4Protocol, ebpf.Sizes{}, proxy.NodeConfig{})
	c := writertest.NewCluster(v1.IPv4Protocol, writertest.Node)
	for i, name := range []string{"a", "b", "c"} {
		c.SetService(writertest.Service("ns", name, netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)}).String()))
		c.SetEndpoints("ns", name, writertest.TCP8080, endpoints(10)...)
	}
	if r := mustSync(t, w, c); !r.Full {
		t.Fatalf("first sync not full: %+v", r)
	}
	eps := endpoints(10)
	c.SetEndpoints("ns", "b", writertest.TCP8080, append(eps[:3:3], eps[4:]...)...)
	r := mustSync(t, w, c)
	// The last endpoint moves into the removed one's slot, the last slot
	// and the removed endpoint go, and the frontend's count drops.
	if diff := cmp.Diff(ebpf.SyncResult{Updates: 2, Deletes: 2, ServicePorts: 3, Endpoints: 29}, r); diff != "" {
		t.Errorf("removing one endpoint (-want +got):\n%s", diff)
	}
	c.SetEndpoints("ns", "b", writertest.TCP8080, eps...)
	r = mustSync(t, w, c)
	if diff := cmp.Diff(ebpf.SyncResult{Updates: 3, ServicePorts: 3, Endpoints: 30}, r); diff != "" {
		t.Errorf("adding one endpoint (-want +got):\n%s", diff)
	}
	w2, fk2 := newWriter(t, v1.IPv4Protocol, ebpf.Sizes{}, proxy.NodeConfig{})
	if _, err := w2.Sync(context.Background(), c.Input()); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ebpftest.Routes(fk2.State()), ebpftest.Routes(fk.State())); diff != "" {
		t.Errorf("partial syncs differ from a full one (-full +partial):\n%s", diff)
	}
}

// TestWriterMapFull checks that maps too small give an error naming the
// map, and that the ports that fit are written.
func TestWriterMapFull(t *testing.T) {
	w, fk := newWriter(t, v1.IPv4Protocol, ebpf.Sizes{Endpoints: 3}, proxy.NodeConfig{})
	c := writertest.NewCluster(v1.IPv4Protocol, writertest.Node)
	c.SetService(writertest.Service("ns", "a", "10.96.0.1"))
	c.SetEndpoints("ns", "a", writertest.TCP8080, endpoints(2)...)
	c.SetService(writertest.Service("ns", "b", "10.96.0.2"))
	c.SetEndpoints("ns", "b", writertest.TCP8080, endpoints(2)...)
	_, err := w.Sync(context.Background(), c.Input())
	if !ebpf.IsMapFull(err) || !strings.Contains(err.Error(), "endpoints holds 3") {
		t.Fatalf("Sync: %v, want a map-full error naming the endpoints map", err)
	}
	want := "10.96.0.1:80/TCP flags=0 affinity=0: 10.0.1.1:8080*1 10.0.1.2:8080*1\n"
	if diff := cmp.Diff(want, ebpftest.Routes(fk.State())); diff != "" {
		t.Errorf("routes (-want +got):\n%s", diff)
	}
}

// TestWriterDrift checks that a change behind the writer's back is seen
// by Drift and repaired by the next sync, which is full.
func TestWriterDrift(t *testing.T) {
	w, fk := newWriter(t, v1.IPv4Protocol, ebpf.Sizes{}, proxy.NodeConfig{})
	c := writertest.NewCluster(v1.IPv4Protocol, writertest.Node)
	c.SetService(writertest.Service("ns", "a", "10.96.0.1"))
	c.SetEndpoints("ns", "a", writertest.TCP8080, endpoints(2)...)
	mustSync(t, w, c)
	want := ebpftest.Routes(fk.State())
	for k := range fk.State().Slots {
		delete(fk.State().Slots, k)
		break
	}
	fk.State().Services[ebpf.Frontend{Addr: netip.MustParseAddr("10.96.9.9"), Port: 1, Protocol: v1.ProtocolTCP}] = ebpf.Service{ID: 99}
	n, err := w.Drift()
	if err != nil || n != 2 {
		t.Fatalf("Drift() = %d, %v; want 2", n, err)
	}
	r := mustSync(t, w, c)
	if !r.Full || r.Drifted != 2 || r.Updates != 1 || r.Deletes != 1 {
		t.Errorf("repairing sync: %+v, want full, 2 drifted, 1 update and 1 delete", r)
	}
	if diff := cmp.Diff(want, ebpftest.Routes(fk.State())); diff != "" {
		t.Errorf("routes after repair (-want +got):\n%s", diff)
	}
}

// TestWriterRefuses checks that special addresses never reach the maps.
func TestWriterRefuses(t *testing.T) {
	w, fk := newWriter(t, v1.IPv4Protocol, ebpf.Sizes{}, proxy.NodeConfig{})
	c := writertest.NewCluster(v1.IPv4Protocol, writertest.Node)
	c.NodeIPs = []netip.Addr{netip.MustParseAddr("192.168.0.1")}
	c.SetService(writertest.Service("ns", "node", "192.168.0.1"))
	c.SetService(writertest.Service("ns", "a", "10.96.0.1"))
	c.SetEndpoints("ns", "a", writertest.TCP8080, writertest.Endpoint{IP: "127.0.0.1"}, writertest.Endpoint{IP: "10.0.1.1"})
	mustSync(t, w, c)
	want := "10.96.0.1:80/TCP flags=0 affinity=0: 10.0.1.1:8080*1\n"
	if diff := cmp.Diff(want, ebpftest.Routes(fk.State())); diff != "" {
		t.Errorf("routes (-want +got):\n%s", diff)
	}
}
