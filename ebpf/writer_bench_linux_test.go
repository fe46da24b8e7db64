package ebpf_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	cebpf "github.com/cilium/ebpf"
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
	dp, _ := benchDatapath(b)
	return dp
}

// benchDatapath opens an IPv4 Datapath attached to a cgroup of a private
// cgroup2 mount (root only; skipped otherwise), and returns its config.
func benchDatapath(b *testing.B) (*ebpf.Datapath, ebpf.DatapathConfig) {
	if os.Geteuid() != 0 {
		b.Skip("kernel maps need root")
	}
	root, bpffs := kerneltest.MountCgroupAndBPF(b)
	// A cgroup of its own: the root of a cgroup2 mount is the host's.
	cg, err := os.MkdirTemp(root, "proxykit-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.Remove(cg) })
	cfg := ebpf.DatapathConfig{Family: v1.IPv4Protocol, CgroupPath: cg, PinPath: bpffs, NamePrefix: "bench"}
	dp, err := ebpf.Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dp.Close(); _ = ebpf.Cleanup(cfg) })
	return dp, cfg
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
// endpoints into empty maps. Besides the wall time it reports the
// process's CPU time in Sync (cpu-ms/op), which the load of a shared
// machine inflates less.
func BenchmarkWriterFullLoad(b *testing.B) {
	for _, kind := range []string{"fake", "kernel"} {
		b.Run(kind, func(b *testing.B) {
			c := writertest.NewCluster(v1.IPv4Protocol, writertest.Node)
			c.LoadBench(30000, 10)
			in := c.Input()
			var cpu time.Duration
			defer func() { b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op") }()
			for b.Loop() {
				b.StopTimer()
				m := benchMaps(b, kind)
				w, err := ebpf.NewWriter(m, ebpf.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: writertest.Node}})
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				start := cpuTime(b)
				if _, err := w.Sync(context.Background(), in); err != nil {
					b.Fatal(err)
				}
				cpu += cpuTime(b) - start
			}
		})
	}
}

// BenchmarkMapMemory reports the kernel's memlock accounting of the maps
// (the memlock line of each map's /proc/self/fdinfo entry): empty at the
// default sizes, and per element once 30,000 Services of 10 endpoints are
// written. Its time is the load's.
func BenchmarkMapMemory(b *testing.B) {
	c := writertest.NewCluster(v1.IPv4Protocol, writertest.Node)
	c.LoadBench(30000, 10)
	in := c.Input()
	for b.Loop() {
		b.StopTimer()
		dp, cfg := benchDatapath(b)
		empty := memlock(b, cfg)
		w, err := ebpf.NewWriter(dp, ebpf.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: writertest.Node}})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		r, err := w.Sync(context.Background(), in)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		loaded := memlock(b, cfg)
		total := 0
		for _, m := range []string{"services", "slots", "endpoints", "affinity", "revnat"} {
			total += empty["lb4_"+m]
		}
		b.ReportMetric(float64(total)/(1<<20), "MiB-empty")
		per := func(m string, n int) float64 { return float64(loaded["lb4_"+m]-empty["lb4_"+m]) / float64(n) }
		b.ReportMetric(per("services", r.ServicePorts), "B/frontend")
		b.ReportMetric(per("slots", r.Endpoints), "B/slot")
		b.ReportMetric(per("endpoints", r.Endpoints), "B/endpoint")
		for m, v := range empty {
			b.Logf("%s: memlock %d bytes empty, %d loaded", m, v, loaded[m])
		}
		b.StartTimer()
	}
}

// cpuTime returns the CPU time the process has used, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// memlock returns the kernel's memlock accounting of cfg's pinned maps,
// by ELF name without the prefix.
func memlock(b *testing.B, cfg ebpf.DatapathConfig) map[string]int {
	out := map[string]int{}
	for _, m := range []string{"services", "slots", "endpoints", "affinity", "revnat"} {
		name := "lb4_" + m
		pinned, err := cebpf.LoadPinnedMap(filepath.Join(cfg.PinPath, cfg.NamePrefix+"_"+name), nil)
		if err != nil {
			b.Fatal(err)
		}
		info, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", pinned.FD()))
		pinned.Close()
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "memlock:"); ok {
				n, err := strconv.Atoi(strings.TrimSpace(v))
				if err != nil {
					b.Fatal(err)
				}
				out[name] = n
			}
		}
		if _, ok := out[name]; !ok {
			b.Fatalf("no memlock line for %s in:\n%s", name, info)
		}
	}
	return out
}
