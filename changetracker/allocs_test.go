package changetracker

import (
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

// Allocation bounds for the trackers' hot paths, at the counts they have
// now: a change that allocates more per Service, or per update, fails
// here rather than in a benchmark nobody reruns. Counts, unlike times, do
// not depend on the machine's load.

// TestInitialLoadAllocs bounds the allocations of loading a cluster into
// fresh trackers and maps: about 9 per Service of one port and one slice
// of 10 endpoints (the API objects, the tracker's copies and the maps'
// entries); the port names of ServicePortMap.Update's result take one
// allocation per Update, not one per Service.
func TestInitialLoadAllocs(t *testing.T) {
	const services = 1000
	svcs, slices := benchCluster(benchSize{services, 10})
	allocs := testing.AllocsPerRun(3, func() { loadCluster(svcs, slices) })
	if perService := allocs / services; perService > 9.3 {
		t.Errorf("loading %d services allocated %.0f times, %.2f per service; want at most 9.3", services, allocs, perService)
	}
}

// TestSingleSliceChangeAllocs bounds the allocations of one endpoint of
// a loaded cluster turning not ready and back, each applied by an Update
// of both maps (as BenchmarkSingleSliceChange does): per change, the
// slice's copy (2), the endpoint list the map stores (1), and the two
// results' sets and maps, which are never nil (10); the port list of a
// one-port Service alternates between an array in the tracker and an
// allocated one (1 for the two changes).
func TestSingleSliceChangeAllocs(t *testing.T) {
	svcs, slices := benchCluster(benchSize{100, 10})
	l := loadCluster(svcs, slices)
	changed := slices[7].DeepCopy()
	changed.Endpoints[0].Conditions.Ready = ptr.To(false)
	update := func(s *discoveryv1.EndpointSlice) {
		if !l.epTracker.EndpointSliceUpdate(s, false) {
			t.Fatal("change not recorded")
		}
		l.svcMap.Update(l.svcTracker)
		if res := l.epMap.Update(l.epTracker); res.UpdatedServices.Len() != 1 {
			t.Fatalf("%d services updated, want 1", res.UpdatedServices.Len())
		}
	}
	allocs := testing.AllocsPerRun(50, func() {
		update(changed)
		update(slices[7])
	})
	if allocs > 27 {
		t.Errorf("two slice changes allocated %.0f times; want at most 27", allocs)
	}
}
