// Package backendtest holds the checks that the tests of every
// proxier.Backend (iptables, IPVS and nftables modes) share.
package backendtest

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/proxier"
)

// Input returns an input of family with no services and no endpoints.
func Input(family v1.IPFamily) *proxier.FamilyInput {
	return &proxier.FamilyInput{Family: family, Services: changetracker.ServicePortMap{}, Endpoints: changetracker.EndpointsMap{}}
}

// SyncRefuses fails t unless b.Sync fails each of syncs (the inputs of
// one Sync each) and still returns one result per input, as
// proxier.Backend's Sync must.
func SyncRefuses(ctx context.Context, t testing.TB, b proxier.Backend, syncs [][]*proxier.FamilyInput) {
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
