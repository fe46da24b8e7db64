package ebpf_test

import (
	"bytes"
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/proxy"
)

// TestModeDryRun checks that a Mode made without Maps prints, after each
// sync, every element its writer would hold, sorted, each frontend with
// the service port that owns it; and that a partial sync prints the
// whole state again.
func TestModeDryRun(t *testing.T) {
	var out bytes.Buffer
	b, err := ebpf.NewMode(context.Background(), ebpf.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: writertest.Node}}, nil,
		ebpf.WithDryRun(&out))
	if err != nil {
		t.Fatal(err)
	}
	c := writertest.NewCluster(v1.IPv4Protocol, writertest.Node)
	c.NodeIPs = []netip.Addr{netip.MustParseAddr("192.168.0.1")}
	c.SetService(writertest.Service("ns", "web", "10.96.0.10", writertest.WithNodePort(30080), writertest.WithExternalIPs("192.0.2.10"), writertest.WithAffinity(600)))
	c.SetEndpoints("ns", "web", writertest.TCP8080, writertest.Endpoint{IP: "10.244.0.11", Node: writertest.Node}, writertest.Endpoint{IP: "10.244.0.12", Node: "node-b"})
	c.SetService(writertest.Service("ns", "empty", "10.96.0.9"))
	sync := func(full bool) {
		t.Helper()
		in := c.Input()
		in.Family, in.Full = v1.IPv4Protocol, full
		if _, err := b.Sync(context.Background(), []*proxy.FamilyInput{in}); err != nil {
			t.Fatal(err)
		}
	}
	sync(true)
	want := `# IPv4: ebpf maps of the socket load balancer: 4 services, 2 slots, 2 endpoints
service 10.96.0.9:80/TCP -> set 1 count 0 affinity 0 cluster-ip # ns/empty:p
service 10.96.0.10:80/TCP -> set 2 count 2 affinity 600 cluster-ip # ns/web:p
service 192.0.2.10:80/TCP -> set 2 count 2 affinity 600 external-ip # ns/web:p
service 192.168.0.1:30080/TCP -> set 2 count 2 affinity 600 node-port # ns/web:p
slot 2/0 -> endpoint 1
slot 2/1 -> endpoint 2
endpoint 1 -> set 2 10.244.0.11:8080
endpoint 2 -> set 2 10.244.0.12:8080
`
	if diff := cmp.Diff(want, out.String()); diff != "" {
		t.Errorf("full sync's dry run (-want +got):\n%s", diff)
	}

	out.Reset()
	c.DeleteService("ns", "empty")
	sync(false)
	// The same maps without the deleted Service's frontend.
	want = strings.Replace(want, "4 services", "3 services", 1)
	want = strings.Replace(want, "service 10.96.0.9:80/TCP -> set 1 count 0 affinity 0 cluster-ip # ns/empty:p\n", "", 1)
	if diff := cmp.Diff(want, out.String()); diff != "" {
		t.Errorf("partial sync's dry run (-want +got):\n%s", diff)
	}
}
