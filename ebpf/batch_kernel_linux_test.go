package ebpf_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/proxy"
)

// openBatchDatapath opens an IPv4 Datapath of sizes on a bpffs and a
// cgroup of a private cgroup2 mount, both the test's own.
func openBatchDatapath(t testing.TB, sizes ebpf.Sizes) *ebpf.Datapath {
	t.Helper()
	kerneltest.Require(t)
	cgRoot, bpffs := kerneltest.MountCgroupAndBPF(t)
	cg := filepath.Join(cgRoot, "proxykit-batch")
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(cg) })
	cfg := ebpf.DatapathConfig{Family: v1.IPv4Protocol, CgroupPath: cg, PinPath: bpffs, NamePrefix: "batch", Sizes: sizes}
	dp, err := ebpf.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dp.Close()
		if err := ebpf.Cleanup(cfg); err != nil {
			t.Error(err)
		}
	})
	return dp
}

func newBatchWriter(t *testing.T, dp *ebpf.Datapath) *ebpf.Writer {
	t.Helper()
	w, err := ebpf.NewWriter(dp, ebpf.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: writertest.Node}})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

var cmpAddr = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

// checkKernelIsWritten fails unless the kernel's maps hold what w wrote.
func checkKernelIsWritten(t *testing.T, dp *ebpf.Datapath, w *ebpf.Writer) {
	t.Helper()
	got, err := dp.Dump()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(w.Written(), got, cmpAddr); diff != "" {
		t.Errorf("kernel maps differ from what the writer wrote (-written +kernel):\n%s", diff)
	}
}

// TestDatapathBatchRefused checks that a kernel refusing batch operations
// gets every element one by one, however many elements the refused batch
// claimed, and is not asked for a batch again.
func TestDatapathBatchRefused(t *testing.T) {
	dp := openBatchDatapath(t, ebpf.Sizes{})
	refused := dp.RefuseBatches()
	w := newBatchWriter(t, dp)
	c := writertest.NewCluster(v1.IPv4Protocol, writertest.Node)
	c.LoadBench(20, 3)
	ctx := context.Background()
	first, err := w.Sync(ctx, c.Input())
	if err != nil {
		t.Fatal(err)
	}
	checkKernelIsWritten(t, dp, w)
	// One endpoint less for one Service, and one Service gone: slot and
	// endpoint deletions, frontend deletion and updates.
	c.SetEndpoints("bench", "svc-3", writertest.TCP8080, endpoints(2)...)
	c.DeleteService("bench", "svc-7")
	c.DeleteEndpoints("bench", "svc-7")
	second, err := w.Sync(ctx, c.Input())
	if err != nil {
		t.Fatal(err)
	}
	if second.Full || second.Deletes == 0 {
		t.Fatalf("second sync: %+v, want a partial one with deletions", second)
	}
	checkKernelIsWritten(t, dp, w)
	want := ebpf.BatchRefusals{
		Batches:  3, // the first of each map
		Elements: first.Updates + second.Updates + second.Deletes,
	}
	if diff := cmp.Diff(want, *refused); diff != "" {
		t.Errorf("operations (-want +got):\n%s", diff)
	}
}

// TestDatapathBatchMapFull checks that a batch stopped by a full map
// writes what fits, names what does not, and that the next sync repairs
// the maps once there is room.
func TestDatapathBatchMapFull(t *testing.T) {
	dp := openBatchDatapath(t, ebpf.Sizes{Services: 4})
	w := newBatchWriter(t, dp)
	c := writertest.NewCluster(v1.IPv4Protocol, writertest.Node)
	c.LoadBench(6, 2)
	ctx := context.Background()
	_, err := w.Sync(ctx, c.Input())
	if !ebpf.IsMapFull(err) || !strings.Contains(err.Error(), "services holds 4") || !strings.Contains(err.Error(), ", and 1 more after it, not written") {
		t.Fatalf("Sync: %v, want a map-full error naming the services map and counting the frontends left out", err)
	}
	got, err := dp.Dump()
	if err != nil {
		t.Fatal(err)
	}
	written := w.Written()
	for f, svc := range got.Services {
		if written.Services[f] != svc {
			t.Errorf("frontend %s: kernel holds %+v, writer wanted %+v", f, svc, written.Services[f])
		}
	}
	if diff := cmp.Diff([]int{4, 12, 12}, []int{len(got.Services), len(got.Slots), len(got.Endpoints)}); diff != "" {
		t.Errorf("frontends, slots, endpoints in the kernel (-want +got):\n%s", diff)
	}

	c.DeleteService("bench", "svc-4")
	c.DeleteService("bench", "svc-5")
	r, err := w.Sync(ctx, c.Input())
	if err != nil || !r.Full {
		t.Fatalf("Sync once there is room: %+v, %v; want a full sync without error", r, err)
	}
	checkKernelIsWritten(t, dp, w)
}

// TestDatapathBatchChunks checks writes of more elements than one batch
// takes: a map that fills in a later batch, and deletions of keys some of
// which are missing.
func TestDatapathBatchChunks(t *testing.T) {
	const size = 5000
	dp := openBatchDatapath(t, ebpf.Sizes{Endpoints: size})
	var ids []uint32
	var eps []ebpf.Endpoint
	for i := range size + 1000 {
		ids = append(ids, uint32(i+1))
		eps = append(eps, ebpf.Endpoint{Service: 1, Addr: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), Port: 80})
	}
	n, err := dp.UpdateEndpoints(ids, eps)
	if n != size || !ebpf.IsMapFull(err) || !strings.Contains(err.Error(), "endpoints holds 5000") {
		t.Fatalf("UpdateEndpoints of %d into %d: %d, %v; want %d and a map-full error naming the map", len(ids), size, n, err, size)
	}
	got, err := dp.Dump()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids[:size] {
		if got.Endpoints[id] != eps[id-1] {
			t.Fatalf("endpoint %d: kernel holds %+v, want %+v", id, got.Endpoints[id], eps[id-1])
		}
	}
	// The written keys with a missing one after every third, and the
	// keys that did not fit at the end.
	var del []uint32
	for i, id := range ids {
		del = append(del, id)
		if i%3 == 0 && i < size {
			del = append(del, uint32(100000+i))
		}
	}
	if n, err := dp.DeleteEndpoints(del); n != len(del) || err != nil {
		t.Fatalf("DeleteEndpoints: %d, %v; want %d, nil", n, err, len(del))
	}
	if got, err := dp.Dump(); err != nil || len(got.Endpoints) != 0 {
		t.Fatalf("after deleting every endpoint the kernel holds %d (%v)", len(got.Endpoints), err)
	}
}
