package manifests

import (
	"context"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestReloadHeapIsFlat reloads a file that alternates between two versions
// (every Service and slice changes each time) a thousand times, with
// informers following, and checks that the heap does not grow with the
// number of reloads. Before the clientset's recorded calls were cleared it
// kept a record of every object written, so the heap grew with each
// reload.
func TestReloadHeapIsFlat(t *testing.T) {
	const services, reloads = 10, 1000
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	versions := []string{servicesYAML("s", "a", services), strings.ReplaceAll(servicesYAML("s", "a", services), `"port": 80,`, `"port": 81,`)}
	write(t, path, versions[0])
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src, _, err := New(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	startInformers(ctx, t, src) // they read every event, as a proxier's do
	reload := func(n int) {
		for i := range n {
			write(t, path, versions[(i+1)%2])
			if _, err := src.Reload(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	// Enough reloads to fill the store's history of recent events, which
	// is bounded but not empty.
	reload(historySize/services + 2)
	before := heap()
	reload(reloads)
	after := heap()
	growth := int64(after) - int64(before)
	t.Logf("heap %d -> %d bytes (%+d) over %d reloads of %d objects", before, after, growth, reloads, 2*services)
	if limit := int64(1 << 20); growth > limit {
		t.Errorf("heap grew by %d bytes over %d reloads, more than %d", growth, reloads, limit)
	}
}
