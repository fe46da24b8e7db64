// Package proxytest is the conformance suite of proxy.Backend: the checks
// every Backend should pass, so that the author of a Backend of their own
// gets them by describing it in a Suite, plus the helpers the tests of
// proxykit's modes share.
//
// The suite drives a Backend as the proxier does: Service and
// EndpointSlice objects go through the real change trackers of each
// family, and the inputs of each Sync are built from them, Full on the
// first one. After each step it compares the Backend's datapath, read by a
// function the Backend's test supplies, and the counts of its results,
// with those of a fresh Backend after one full sync of the same maps. The
// checks are full-versus-partial equality (CheckPartialSyncs), convergence
// after a failed apply (CheckRetry), the full sync after lost or a change
// of the node (CheckFullResync), and one input per family in order
// (CheckFamilies). The Services are dual-stack and single-stack of each
// family, so a Backend of two families gets inputs of both, and one of a
// single family its own side of them.
//
// In a Backend's test:
//
//	func TestConformance(t *testing.T) {
//		proxytest.Suite{
//			Families: []v1.IPFamily{v1.IPv4Protocol},
//			New: func(t testing.TB, node proxy.NodeConfig) (proxy.Backend, proxytest.Datapath) {
//				fake := newFakeDatapath()
//				b := mybackend.New(node, fake)
//				return b, proxytest.Datapath{Dump: fake.Dump, FailNextApply: fake.FailNext, Wipe: fake.Clear}
//			},
//		}.Run(t)
//	}
//
// It imports proxy and changetracker of proxykit, nothing else.
package proxytest

import (
	"context"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/proxy"
)

// Input returns an input of family with no services and no endpoints.
func Input(family v1.IPFamily) *proxy.FamilyInput {
	return &proxy.FamilyInput{Family: family, Services: changetracker.ServicePortMap{}, Endpoints: changetracker.EndpointsMap{}}
}

// SyncRefuses fails t unless b.Sync fails each of syncs (the inputs of
// one Sync each) and still returns one result per input, as
// proxy.Backend's Sync must.
func SyncRefuses(ctx context.Context, t testing.TB, b proxy.Backend, syncs [][]*proxy.FamilyInput) {
	t.Helper()
	for _, ins := range syncs {
		outs, err := b.Sync(ctx, ins)
		if err == nil {
			t.Errorf("Sync of %d inputs succeeded, want an error", len(ins))
		}
		if len(outs) != len(ins) {
			t.Errorf("Sync of %d inputs returned %d results", len(ins), len(outs))
		}
	}
}

// SortRuns returns dump with each run of consecutive lines that key maps
// to the same non-empty string sorted, and every other line in its place:
// for a Datapath.Dump whose datapath keeps some things in the order they
// were written where the order means nothing (the elements of a set, the
// rules of distinct service ports in a chain), so that partial syncs and
// a full one dump alike. A line key maps to "" ends a run.
func SortRuns(dump string, key func(line string) string) string {
	lines := strings.Split(dump, "\n")
	for i := 0; i < len(lines); {
		k := key(lines[i])
		j := i + 1
		for k != "" && j < len(lines) && key(lines[j]) == k {
			j++
		}
		slices.Sort(lines[i:j])
		i = j
	}
	return strings.Join(lines, "\n")
}
