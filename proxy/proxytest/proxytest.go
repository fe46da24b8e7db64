// Package proxytest holds the checks that the tests of every
// proxy.Backend (iptables, IPVS and nftables modes) share.
package proxytest

import (
	"context"
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
