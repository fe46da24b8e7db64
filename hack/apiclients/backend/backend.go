// Package backend is a proxy mode written outside proxykit: a Backend that
// keeps, per IP family, the table a datapath would program (service address
// to the endpoints this node sends its traffic to), as an eBPF or OVS
// proxy fills its maps.
package backend

import (
	"context"
	"sync"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/proxy"
)

// Table is a Backend's datapath for one family: "10.96.0.10:80/TCP" to
// the "ip:port" of each endpoint cluster traffic goes to.
type Table map[string][]string

// Backend rewrites every family's Table at each Sync.
type Backend struct {
	NodeName string
	mu       sync.Mutex
	tables   map[v1.IPFamily]Table
}

var _ proxy.Backend = (*Backend)(nil)

// Sync is part of proxy.Backend.
func (b *Backend) Sync(_ context.Context, ins []*proxy.FamilyInput) ([]proxy.SyncResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tables == nil {
		b.tables = map[v1.IPFamily]Table{}
	}
	results := make([]proxy.SyncResult, len(ins))
	for i, in := range ins {
		t := Table{}
		for name, svc := range in.Services {
			cluster, _, _, _ := changetracker.CategorizeEndpoints(in.Endpoints[name], svc, b.NodeName, in.NodeLabels)
			for _, ep := range cluster {
				t[svc.String()] = append(t[svc.String()], ep.String())
			}
			results[i].Endpoints += len(cluster)
		}
		b.tables[in.Family] = t
		results[i].Full, results[i].ServicePorts = true, len(in.Services)
	}
	return results, nil
}

// RequestFullSync was part of proxy.Backend before FamilyInput.Full took
// its place; a Backend that keeps it still satisfies the interface.
func (*Backend) RequestFullSync() {}

// Run is part of proxy.Backend: no other program touches a Table.
func (*Backend) Run(context.Context, func()) {}

// Table returns the family's table as the last Sync left it.
func (b *Backend) Table(family v1.IPFamily) Table {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tables[family]
}
