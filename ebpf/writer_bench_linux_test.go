package ebpf_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/ebpf/ebpftest"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/proxy"
)

// benchMaps returns the fake maps, or a kernel Datapath attached to a
// cgroup of a private cgroup2 mount (root only; skipped otherwise).
func benchMaps(b *testing.B, kind string) ebpf.Maps {
	if kind == "fake" {
		return ebpftest.NewFake(v1.IPv4Protocol, ebpf.Sizes{})
	}
	if os.Geteuid() != 0 {
		b.Skip("kernel maps need root")
	}
	cg, bpffs := kerneltest.MountCgroupAndBPF(b)
	cfg := ebpf.DatapathConfig{Family: v1.IPv4Protocol, CgroupPath: cg, PinPath: bpffs, NamePrefix: "bench"}
	dp, err := ebpf.Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dp.Close(); _ = ebpf.Cleanup(cfg) })
	return dp
}

// BenchmarkWriterEndpointChange is one endpoint removed from or added
// back to one Service among services Services of 10 endpoints: the
// writer's Sync alone (the trackers' update is outside the timer), over
// the fake maps and over the kernel's.
func BenchmarkWriterEndpointChange(b *testing.B) {
	for _, kind := range []string{"fake", "kernel"} {
		for _, services := range []int{1000, 10000, 30000} {
			b.Run(fmt.Sprintf("%s/%d", kind, services), func(b *testing.B) {
				m := benchMaps(b, kind)
				w, err := ebpf.NewWriter(m, ebpf.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: writertest.Node}})
				if err != nil {
					b.Fatal(err)
				}
				c := writertest.NewCluster(v1.IPv4Protocol, writertest.Node)
				c.LoadBench(services, 10)
				c.SetService(writertest.Service("bench", "churn", "10.97.0.1"))
				eps := endpoints(10)
				c.SetEndpoints("bench", "churn", writertest.TCP8080, eps...)
				if _, err := w.Sync(context.Background(), c.Input()); err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					b.StopTimer()
					if i%2 == 0 {
						c.SetEndpoints("bench", "churn", writertest.TCP8080, eps[1:]...)
					} else {
						c.SetEndpoints("bench", "churn", writertest.TCP8080, eps...)
					}
					in := c.Input()
					b.StartTimer()
					if r, err := w.Sync(ctx, in); err != nil || r.Full {
						b.Fatalf("Sync: %+v, %v", r, err)
					}
				}
			})
		}
	}
}

// BenchmarkWriterFullLoad is the first sync of 30,000 Services of 10
// endpoints into empty maps.
func BenchmarkWriterFullLoad(b *testing.B) {
	for _, kind := range []string{"fake", "kernel"} {
		b.Run(kind, func(b *testing.B) {
			c := writertest.NewCluster(v1.IPv4Protocol, writertest.Node)
			c.LoadBench(30000, 10)
			in := c.Input()
			for b.Loop() {
				b.StopTimer()
				m := benchMaps(b, kind)
				w, err := ebpf.NewWriter(m, ebpf.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: writertest.Node}})
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if _, err := w.Sync(context.Background(), in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
