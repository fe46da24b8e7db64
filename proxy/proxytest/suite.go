package proxytest

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/proxykit/proxykit/proxy"
)

// Suite is the conformance suite of one kind of proxy.Backend: the checks
// every Backend should pass, whatever its datapath. It drives the Backend
// as the proxier does, with inputs built by the real change trackers from
// Service and EndpointSlice objects (dual-stack and single-stack ones,
// ClusterIP, NodePort and LoadBalancer, TCP, UDP and SCTP, local, remote,
// terminating and not-ready endpoints), and judges it by comparing the
// state its datapath ends in with the state a fresh Backend reaches with
// one full sync of the same maps: only the Backend's author can read its
// datapath, so New returns that reading with the Backend.
//
// A Backend of one family is checked with a Suite per family (the
// objects are dual-stack, so the IPv6 Suite sees the IPv6 side of the
// same Services); one that serves the node's families in one Sync is
// checked with both in Families.
type Suite struct {
	// Families are the families the Backend serves, in the order its
	// Sync takes their inputs: one, or IPv4 and IPv6 in either order.
	// Any other value fails every check.
	Families []v1.IPFamily
	// New makes a fresh Backend of Families for node over a datapath of
	// its own that holds nothing yet, and the means to read and break that
	// datapath. A check calls it once for the Backend it drives and once
	// more for each comparison, so the calls must not share a datapath.
	// node has Name NodeName and the pod network of both families in
	// ClusterCIDRs; hand it to the Backend's renderers as their
	// proxy.NodeConfig. Release what the Backend holds with t.Cleanup.
	New func(t testing.TB, node proxy.NodeConfig) (proxy.Backend, Datapath)
}

// Datapath is how the suite reads and breaks the datapath of one Backend
// that Suite.New made.
type Datapath struct {
	// Dump returns the state of the datapath as text (a fake's dump,
	// say), in a form that does not depend on the order things were
	// written in: two Backends that programmed the same maps must dump
	// the same text, and two that programmed different maps different
	// texts. Required.
	Dump func() string
	// FailNextApply makes the Backend's next apply to the datapath fail
	// (the next one only), as a refused iptables-restore or nft
	// transaction does. Nil skips CheckRetry.
	FailNextApply func()
	// Wipe removes the Backend's state from the datapath, as another
	// program does (nft flush ruleset, iptables -F) before the Backend
	// calls lost. Nil makes CheckFullResync check a full sync over the
	// state as it is.
	Wipe func()
}

// Run runs every check of s as a subtest of t. Each check stops, with
// t.Fatal, at the first state that differs from a fresh Backend's.
func (s Suite) Run(t *testing.T) {
	t.Helper()
	for _, c := range []struct {
		name  string
		check func(testing.TB)
	}{
		{"PartialSyncs", s.CheckPartialSyncs},
		{"Retry", s.CheckRetry},
		{"FullResync", s.CheckFullResync},
		{"Families", s.CheckFamilies},
	} {
		t.Run(c.name, func(t *testing.T) { c.check(t) })
	}
}

// CheckPartialSyncs fails t unless, after a first full sync and then
// each step of a sequence of changes (endpoints added, terminating,
// removed; Services added, changed, turned from LoadBalancer to
// ClusterIP, removed before or after their endpoints; changes of one
// family alone), each synced with an input that is not Full, the
// Backend's datapath and the counts of its results equal those of a
// fresh Backend after one full sync of the maps as they are after that
// step. It stops at the first step that differs.
func (s Suite) CheckPartialSyncs(t testing.TB) {
	t.Helper()
	r := s.start(t)
	for _, st := range scenario() {
		r.step(t, st)
		r.mustSync(t, st.name, false)
		r.matchFresh(t, "after partial syncs up to "+st.name)
	}
}

// CheckRetry fails t unless a Backend whose apply failed (Sync returning
// an error and one result per input) converges: the next Sync, with new
// changes, must reach the state a fresh Backend reaches with one full
// sync; and so must a Sync with no new changes after another failure. The
// inputs after a failure are not Full, as the composition leaves it to
// the Backend to cover what a failed sync left. The syncs it makes fail
// change every family, so that even a Backend that applies nothing when
// nothing changed has an apply to fail; one of them succeeding fails t.
// It skips when the Datapath has no FailNextApply.
func (s Suite) CheckRetry(t testing.TB) {
	t.Helper()
	r := s.start(t)
	if r.dp.FailNextApply == nil {
		t.Skip("the Datapath has no FailNextApply")
	}
	steps := scenario()
	for i, st := range steps {
		r.step(t, st)
		switch i {
		case 1, 6:
			// Steps that change both families, so that a Backend of
			// either has something to apply.
			r.dp.FailNextApply()
			if err := r.sync(t, st.name, false); err == nil {
				t.Fatalf("%s: Sync succeeded after FailNextApply, want an error", st.name)
			}
			if i == 6 {
				// A retry with nothing new to apply.
				r.mustSync(t, st.name+" (retried)", false)
				r.matchFresh(t, "after a failed sync of "+st.name+" and a retry with no changes")
			}
		case 2:
			r.mustSync(t, st.name, false)
			r.matchFresh(t, "after a failed sync of "+steps[1].name+" and a sync of "+st.name)
		default:
			r.mustSync(t, st.name, false)
		}
	}
	r.matchFresh(t, "at the end")
}

// CheckFullResync fails t unless a Sync whose inputs are Full, as the
// composition sends after the Backend called lost or when the node's
// labels or addresses changed, reaches the state of a fresh Backend: after
// the datapath was wiped (when the Datapath has Wipe), over the state as
// it is, with the node's labels and addresses changed, and the partial
// syncs that follow a full one.
func (s Suite) CheckFullResync(t testing.TB) {
	t.Helper()
	r := s.start(t)
	steps := scenario()
	r.step(t, steps[0])
	r.mustSync(t, steps[0].name, false)
	if r.dp.Wipe != nil {
		r.dp.Wipe()
		r.step(t, steps[1])
		r.mustSync(t, steps[1].name+" after the datapath was wiped", true)
		r.matchFresh(t, "after the datapath was wiped and a full sync of "+steps[1].name)
	} else {
		r.step(t, steps[1])
		r.mustSync(t, steps[1].name, false)
	}
	r.mustSync(t, "a full sync with no changes", true)
	r.matchFresh(t, "after a full sync with no changes")

	r.d.nodeIPs, r.d.labels = movedNodeIPs, movedLabels
	r.step(t, steps[2])
	r.mustSync(t, steps[2].name+" on a node whose labels and addresses changed", true)
	r.matchFresh(t, "after a full sync of "+steps[2].name+" on a node whose labels and addresses changed")
	for _, st := range steps[3:] {
		r.step(t, st)
		r.mustSync(t, st.name, false)
	}
	r.matchFresh(t, "after partial syncs that followed full ones")
}

// CheckFamilies fails t unless the Backend refuses a Sync whose inputs
// are not one per family of Families in that order (none, one too many,
// another family, the families swapped or one missing), with an error
// and one result per input each time, and still reaches a fresh Backend's
// state with the partial syncs that follow.
func (s Suite) CheckFamilies(t testing.TB) {
	t.Helper()
	r := s.start(t)
	_, ctx := ktesting.NewTestContext(t)
	SyncRefuses(ctx, t, r.b, wrongFamilies(s.Families))
	for _, st := range scenario()[:3] {
		r.step(t, st)
		r.mustSync(t, st.name+" after refused syncs", false)
	}
	r.matchFresh(t, "after refused syncs and partial syncs")
}

// wrongFamilies returns inputs of families that a Backend of families
// must refuse.
func wrongFamilies(families []v1.IPFamily) [][]*proxy.FamilyInput {
	inputs := func(fs ...v1.IPFamily) []*proxy.FamilyInput {
		ins := make([]*proxy.FamilyInput, len(fs))
		for i, f := range fs {
			ins[i] = Input(f)
		}
		return ins
	}
	other := func(f v1.IPFamily) v1.IPFamily {
		if f == v1.IPv4Protocol {
			return v1.IPv6Protocol
		}
		return v1.IPv4Protocol
	}
	out := [][]*proxy.FamilyInput{inputs(), inputs(append(families[:len(families):len(families)], families[0])...)}
	switch len(families) {
	case 1:
		out = append(out, inputs(other(families[0])))
	case 2:
		a, b := families[0], families[1]
		out = append(out, inputs(b, a), inputs(a), inputs(b), inputs(a, a))
	}
	return out
}

// run is one Backend under check and the driver in front of it.
type run struct {
	s      Suite
	b      proxy.Backend
	dp     Datapath
	d      *driver
	ctx    context.Context
	logger klog.Logger
	// results are those of the last good Sync.
	results []proxy.SyncResult
}

// start makes a Backend and gives it its first, full, sync of start().
func (s Suite) start(t testing.TB) *run {
	t.Helper()
	if len(s.Families) == 0 || len(s.Families) > 2 || (len(s.Families) == 2 && s.Families[0] == s.Families[1]) {
		t.Fatalf("Suite.Families %v: want one family, or both", s.Families)
	}
	logger, ctx := ktesting.NewTestContext(t)
	r := &run{s: s, ctx: ctx, logger: logger}
	r.b, r.dp = s.New(t, node())
	if r.dp.Dump == nil {
		t.Fatal("Suite.New returned a Datapath without Dump")
	}
	r.d = newDriver(logger, s.Families, node(), nodeIPs, nodeLabels)
	r.step(t, step{name: "the start", changes: start()})
	r.mustSync(t, "the first sync", false)
	r.matchFresh(t, "after the first sync")
	return r
}

// step hands st's changes to the trackers.
func (r *run) step(t testing.TB, st step) {
	t.Helper()
	for _, ch := range st.changes {
		r.d.apply(ch)
	}
}

// sync syncs the Backend with the driver's inputs (Full when full is set)
// and returns its error; it fails t unless there is one result per input.
func (r *run) sync(t testing.TB, what string, full bool) error {
	t.Helper()
	ins := r.d.inputs(full)
	outs, err := r.b.Sync(r.ctx, ins)
	if len(outs) != len(ins) {
		t.Fatalf("%s: Sync of %d inputs returned %d results (error %v)", what, len(ins), len(outs), err)
	}
	if err == nil {
		r.d.synced = true
		r.results = outs
	}
	return err
}

// mustSync is sync that fails t on an error.
func (r *run) mustSync(t testing.TB, what string, full bool) {
	t.Helper()
	if err := r.sync(t, what, full); err != nil {
		t.Fatalf("%s: Sync: %v", what, err)
	}
}

// state is what the suite compares of two Backends: the dump of the
// datapath, and the counts of their last results, which are the totals
// of what they program whether the sync was full or not.
type state struct {
	Dump   []string // by line, for a readable diff
	Counts []proxy.SyncResult
}

func (r *run) state() state {
	st := state{Dump: strings.Split(r.dp.Dump(), "\n")}
	for _, out := range r.results {
		out.Full = false
		st.Counts = append(st.Counts, out)
	}
	return st
}

// matchFresh fails t unless r's state equals that of a fresh Backend
// after one full sync of r's objects.
func (r *run) matchFresh(t testing.TB, when string) {
	t.Helper()
	fresh := &run{s: r.s, ctx: r.ctx, logger: r.logger, d: r.d.replay(r.logger)}
	fresh.b, fresh.dp = r.s.New(t, node())
	fresh.mustSync(t, "the full sync of a fresh Backend", true)
	if diff := cmp.Diff(fresh.state(), r.state()); diff != "" {
		t.Fatalf("%s, the Backend's state differs from a fresh Backend's after one full sync (-fresh +got):\n%s", when, diff)
	}
}
