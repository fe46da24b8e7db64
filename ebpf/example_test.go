package ebpf_test

import (
	"context"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/ebpf/ebpftest"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
)

// A writer over the fake maps, and where a connection to the Service
// goes.
func ExampleWriter() {
	fake := ebpftest.NewFake(v1.IPv4Protocol, ebpf.Sizes{})
	w, err := ebpf.NewWriter(fake, ebpf.WriterConfig{Family: v1.IPv4Protocol})
	if err != nil {
		panic(err)
	}
	c := writertest.NewCluster(v1.IPv4Protocol, "node-a")
	c.SetService(writertest.Service("ns", "web", "10.96.0.10"))
	c.SetEndpoints("ns", "web", writertest.TCP8080, writertest.Endpoint{IP: "10.0.1.1"}, writertest.Endpoint{IP: "10.0.1.2"})
	if _, err := w.Sync(context.Background(), c.Input()); err != nil {
		panic(err)
	}
	dst := ebpf.Frontend{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP}
	for _, o := range fake.Trace(ebpftest.Connection{Destination: dst}) {
		fmt.Println(o)
	}
	// Output:
	// -> 10.0.1.1:8080 (p=0.5)
	// -> 10.0.1.2:8080 (p=0.5)
}
