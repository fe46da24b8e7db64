package ebpf_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/ebpf/ebpftest"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/proxy"
)

// TestWriterBatches checks that a sync writes each map in one call, so in
// one batch on the kernel's maps, however many elements change.
func TestWriterBatches(t *testing.T) {
	w, fk := newWriter(t, v1.IPv4Protocol, ebpf.Sizes{}, proxy.NodeConfig{})
	c := writertest.NewCluster(v1.IPv4Protocol, writertest.Node)
	eps := endpoints(4)
	type counts struct{ Calls, Ops, Updates, Deletes int }
	for _, step := range []struct {
		name   string
		change func()
		want   counts
	}{{
		name: "first sync of 51 Services of 4 endpoints",
		change: func() {
			c.LoadBench(50, 4)
			c.SetService(writertest.Service("bench", "churn", "10.97.0.1"))
			c.SetEndpoints("bench", "churn", writertest.TCP8080, eps...)
		},
		// endpoints, slots, frontends
		want: counts{Calls: 3, Ops: 51 * 9, Updates: 51 * 9},
	}, {
		name:   "one endpoint less",
		change: func() { c.SetEndpoints("bench", "churn", writertest.TCP8080, eps[1:]...) },
		// the first slot takes the last one's endpoint, the frontend's
		// count drops, the last slot and the endpoint go
		want: counts{Calls: 4, Ops: 4, Updates: 2, Deletes: 2},
	}, {
		name: "two Services gone, one endpoint back",
		change: func() {
			c.DeleteService("bench", "svc-2")
			c.DeleteService("bench", "svc-3")
			c.SetEndpoints("bench", "churn", writertest.TCP8080, eps...)
		},
		want: counts{Calls: 6, Ops: 3 + 2*9, Updates: 3, Deletes: 2 * 9},
	}} {
		calls, ops := fk.Calls, fk.Ops
		step.change()
		r := mustSync(t, w, c)
		got := counts{Calls: fk.Calls - calls, Ops: fk.Ops - ops, Updates: r.Updates, Deletes: r.Deletes}
		if diff := cmp.Diff(step.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", step.name, diff)
		}
	}
}

// TestWriterServicesMapFull checks a services map too small for the
// frontends: what fits is written with every endpoint, the error names
// the map and counts what was left out, the next sync repairs the maps
// once there is room, and a frontend that goes makes room for one that
// comes in the same sync.
func TestWriterServicesMapFull(t *testing.T) {
	w, fk := newWriter(t, v1.IPv4Protocol, ebpf.Sizes{Services: 3}, proxy.NodeConfig{})
	c := writertest.NewCluster(v1.IPv4Protocol, writertest.Node)
	c.LoadBench(5, 2)
	_, err := w.Sync(context.Background(), c.Input())
	if !ebpf.IsMapFull(err) || !strings.Contains(err.Error(), "services holds 3") || !strings.Contains(err.Error(), ", and 1 more after it, not written") {
		t.Fatalf("Sync: %v, want a map-full error naming the services map and counting the frontends left out", err)
	}
	s := fk.State()
	if diff := cmp.Diff([]int{3, 10, 10}, []int{len(s.Services), len(s.Slots), len(s.Endpoints)}); diff != "" {
		t.Errorf("frontends, slots, endpoints written (-want +got):\n%s", diff)
	}

	c.DeleteService("bench", "svc-3")
	c.DeleteService("bench", "svc-4")
	if r := mustSync(t, w, c); !r.Full {
		t.Errorf("the sync after a failed one was not full: %+v", r)
	}
	checkAsFresh(t, fk, c)

	c.DeleteService("bench", "svc-0")
	c.SetService(writertest.Service("bench", "new", "10.96.9.1"))
	c.SetEndpoints("bench", "new", writertest.TCP8080, endpoints(1)...)
	if r := mustSync(t, w, c); r.Full {
		t.Errorf("replacing a Service made a full sync: %+v", r)
	}
	checkAsFresh(t, fk, c)
}

// checkAsFresh fails unless fk routes as the maps of a new writer's
// first sync of c do.
func checkAsFresh(t *testing.T, fk *ebpftest.Fake, c *writertest.Cluster) {
	t.Helper()
	w2, fk2 := newWriter(t, v1.IPv4Protocol, fk.Sizes(), proxy.NodeConfig{})
	if _, err := w2.Sync(context.Background(), c.Input()); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ebpftest.Routes(fk2.State()), ebpftest.Routes(fk.State())); diff != "" {
		t.Errorf("routes (-fresh writer +repaired):\n%s", diff)
	}
}
