package proxytest_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/proxy"
	"github.com/proxykit/proxykit/proxy/proxytest"
)

// flaw is a way the in-memory Backend can be broken on purpose.
type flaw int

const (
	sound flaw = iota
	// ignoresEndpointChanges rewrites, in a partial sync, only the
	// Services whose ports changed.
	ignoresEndpointChanges
	// forgetsFailedSyncs goes on with partial syncs after a failed apply,
	// so the failed sync's changes are never applied.
	forgetsFailedSyncs
	// ignoresFull syncs partially whatever the input says.
	ignoresFull
	// takesAnyFamilies applies whatever inputs it is given.
	takesAnyFamilies
	// wrongCounts reports the counts of the last sync's changes alone.
	wrongCounts
	// keepsFirstNode renders with the node labels and addresses of its
	// first sync.
	keepsFirstNode
)

// memBackend is a proxy.Backend whose datapath is a map in memory: one
// line per service port of each family, naming what it sends traffic to.
// Partial syncs rewrite the ports of FamilyInput.ChangedServices.
type memBackend struct {
	families []v1.IPFamily
	flaw     flaw

	mu       sync.Mutex
	lines    map[v1.IPFamily]map[changetracker.ServicePortName]string
	failNext bool
	needFull bool
	// first holds the first input of each family, for keepsFirstNode.
	first map[v1.IPFamily]*proxy.FamilyInput
}

var _ proxy.Backend = (*memBackend)(nil)

func newMemBackend(families []v1.IPFamily, f flaw) *memBackend {
	return &memBackend{families: families, flaw: f, lines: map[v1.IPFamily]map[changetracker.ServicePortName]string{},
		first: map[v1.IPFamily]*proxy.FamilyInput{}}
}

func (b *memBackend) Sync(ctx context.Context, ins []*proxy.FamilyInput) ([]proxy.SyncResult, error) {
	outs := make([]proxy.SyncResult, len(ins))
	if b.flaw != takesAnyFamilies {
		if !slices.Equal(b.families, familiesOf(ins)) {
			return outs, fmt.Errorf("given the inputs of %v, want %v", familiesOf(ins), b.families)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failNext {
		b.failNext = false
		if b.flaw != forgetsFailedSyncs {
			b.needFull = true
		}
		return outs, errors.New("apply failed")
	}
	full := b.needFull
	for _, in := range ins {
		full = full || (in.Full && b.flaw != ignoresFull)
	}
	for i, in := range ins {
		outs[i] = b.syncFamily(in, full)
	}
	b.needFull = false
	return outs, nil
}

func familiesOf(ins []*proxy.FamilyInput) []v1.IPFamily {
	var out []v1.IPFamily
	for _, in := range ins {
		out = append(out, in.Family)
	}
	return out
}

func (b *memBackend) syncFamily(in *proxy.FamilyInput, full bool) proxy.SyncResult {
	if b.first[in.Family] == nil {
		b.first[in.Family] = in
	}
	if b.flaw == keepsFirstNode {
		withFirst := *in
		withFirst.NodeLabels, withFirst.NodeIPs = b.first[in.Family].NodeLabels, b.first[in.Family].NodeIPs
		in = &withFirst
	}
	lines := b.lines[in.Family]
	if full || lines == nil {
		lines = map[changetracker.ServicePortName]string{}
		b.lines[in.Family] = lines
		for name := range in.Services {
			lines[name] = render(in, name)
		}
	} else {
		changed := in.ChangedServices
		if b.flaw == ignoresEndpointChanges {
			changed = map[types.NamespacedName][]changetracker.ServicePortName{}
			for svc := range in.ServiceChanges.UpdatedServices {
				changed[svc] = in.ChangedServices[svc]
			}
		}
		for svc, ports := range changed {
			maps.DeleteFunc(lines, func(name changetracker.ServicePortName, _ string) bool { return name.NamespacedName == svc })
			for _, name := range ports {
				lines[name] = render(in, name)
			}
		}
	}
	out := proxy.SyncResult{Full: full, ServicePorts: len(lines)}
	counted := in.Services
	if b.flaw == wrongCounts && !full {
		counted = changetracker.ServicePortMap{}
		for _, ports := range in.ChangedServices {
			for _, name := range ports {
				counted[name] = in.Services[name]
			}
		}
	}
	for name := range counted {
		_, local, all, _ := changetracker.CategorizeEndpoints(in.Endpoints[name], in.Services[name], proxytest.NodeName, in.NodeLabels)
		out.Endpoints += len(all)
		if in.Services[name].UsesLocalEndpoints() && len(local) == 0 {
			out.NoLocalEndpointsExternal++
		}
	}
	return out
}

// render is the line of one service port: its addresses and what traffic
// to it reaches.
func render(in *proxy.FamilyInput, name changetracker.ServicePortName) string {
	svc := in.Services[name]
	cluster, local, _, any := changetracker.CategorizeEndpoints(in.Endpoints[name], svc, proxytest.NodeName, in.NodeLabels)
	return fmt.Sprintf("%s %s node port %d external %v %v affinity %s %d local policy %v: cluster %v local %v any %v node %v",
		name, svc, svc.NodePort(), svc.ExternalIPs(), svc.LoadBalancerVIPs(), svc.SessionAffinityType(), svc.StickyMaxAgeSeconds(),
		svc.ExternalPolicyLocal(), endpointStrings(cluster), endpointStrings(local), any, proxy.NodeIPsOf(in.Family, in.NodeIPs))
}

func endpointStrings(eps []changetracker.Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.String())
	}
	return out
}

func (b *memBackend) Run(ctx context.Context, lost func()) {}

func (b *memBackend) dump() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for family, lines := range b.lines {
		for _, l := range lines {
			out = append(out, string(family)+" "+l)
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

func memSuite(families []v1.IPFamily, f flaw) proxytest.Suite {
	return proxytest.Suite{
		Families: families,
		New: func(t testing.TB, node proxy.NodeConfig) (proxy.Backend, proxytest.Datapath) {
			if node.Name != proxytest.NodeName {
				t.Fatalf("node %q, want %q", node.Name, proxytest.NodeName)
			}
			b := newMemBackend(families, f)
			return b, proxytest.Datapath{
				Dump: b.dump,
				FailNextApply: func() {
					b.mu.Lock()
					defer b.mu.Unlock()
					b.failNext = true
				},
				Wipe: func() {
					b.mu.Lock()
					defer b.mu.Unlock()
					clear(b.lines)
				},
			}
		},
	}
}

var familySets = [][]v1.IPFamily{
	{v1.IPv4Protocol},
	{v1.IPv6Protocol},
	{v1.IPv4Protocol, v1.IPv6Protocol},
	{v1.IPv6Protocol, v1.IPv4Protocol},
}

// TestSuiteRun runs the suite on the sound in-memory Backend, of each
// family and of both.
func TestSuiteRun(t *testing.T) {
	for _, families := range familySets {
		t.Run(fmt.Sprint(families), memSuite(families, sound).Run)
	}
}

// TestSuiteFindsFlaws checks that each check of the suite fails on a
// Backend with the flaw it is there to find, and only the checks that
// should: run on a sound Backend none fails.
func TestSuiteFindsFlaws(t *testing.T) {
	for _, tc := range []struct {
		name string
		flaw flaw
		want []string
	}{
		{"sound", sound, nil},
		{"ignores endpoint changes", ignoresEndpointChanges, []string{"FullResync", "PartialSyncs", "Retry", "Families"}},
		{"forgets failed syncs", forgetsFailedSyncs, []string{"Retry"}},
		{"ignores Full", ignoresFull, []string{"FullResync"}},
		{"takes any families", takesAnyFamilies, []string{"Families"}},
		{"counts only what changed", wrongCounts, []string{"FullResync", "PartialSyncs", "Retry", "Families"}},
		{"keeps the first node labels and addresses", keepsFirstNode, []string{"FullResync"}},
	} {
		for _, families := range familySets {
			t.Run(tc.name+fmt.Sprint(families), func(t *testing.T) {
				s := memSuite(families, tc.flaw)
				checks := map[string]func(testing.TB){
					"PartialSyncs": s.CheckPartialSyncs, "Retry": s.CheckRetry,
					"FullResync": s.CheckFullResync, "Families": s.CheckFamilies,
				}
				var failed []string
				for name, check := range checks {
					if r := record(t, check); r.failed {
						failed = append(failed, name)
						t.Logf("%s reported:\n%s", name, strings.Join(r.errors, "\n"))
					}
				}
				if diff := cmp.Diff(tc.want, failed, sortStrings); diff != "" {
					t.Errorf("checks that failed (-want +got):\n%s", diff)
				}
			})
		}
	}
}

var sortStrings = cmp.Transformer("sort", func(in []string) []string {
	out := slices.Clone(in)
	slices.Sort(out)
	return out
})

// recorder is a testing.TB that records failures instead of reporting
// them, so that a test can check that a check fails. Its Fatal and Skip
// end the goroutine of the check, as testing.T's do.
type recorder struct {
	testing.TB
	mu      sync.Mutex
	failed  bool
	skipped bool
	errors  []string
}

// record runs check with a recorder over t and returns it.
func record(t testing.TB, check func(testing.TB)) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		check(r)
	}()
	<-done
	return r
}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
func (r *recorder) Error(args ...any)                 { r.Errorf("%s", fmt.Sprint(args...)) }
func (r *recorder) Fatalf(format string, args ...any) { r.Errorf(format, args...); runtime.Goexit() }
func (r *recorder) Fatal(args ...any)                 { r.Error(args...); runtime.Goexit() }
func (r *recorder) Fail()                             { r.Errorf("Fail") }
func (r *recorder) FailNow()                          { r.Fail(); runtime.Goexit() }
func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}
func (r *recorder) Skip(args ...any)                 { r.SkipNow() }
func (r *recorder) Skipf(format string, args ...any) { r.SkipNow() }
func (r *recorder) SkipNow() {
	r.mu.Lock()
	r.skipped = true
	r.mu.Unlock()
	runtime.Goexit()
}
func (r *recorder) Skipped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.skipped
}

// TestSuiteSkipsRetryWithoutHook checks that CheckRetry skips, and does
// not fail, when the Datapath cannot make an apply fail.
func TestSuiteSkipsRetryWithoutHook(t *testing.T) {
	s := memSuite([]v1.IPFamily{v1.IPv4Protocol}, sound)
	newBackend := s.New
	s.New = func(t testing.TB, node proxy.NodeConfig) (proxy.Backend, proxytest.Datapath) {
		b, dp := newBackend(t, node)
		dp.FailNextApply = nil
		return b, dp
	}
	r := record(t, s.CheckRetry)
	if r.failed || !r.skipped {
		t.Errorf("CheckRetry without FailNextApply: failed %v (%q), skipped %v; want a skip", r.failed, r.errors, r.skipped)
	}
}
