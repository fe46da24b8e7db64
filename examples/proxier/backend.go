package main

import (
	"context"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/changetracker"
)

// backend is what a proxy mode does: turn the service and endpoint maps of
// the IP families it serves into kernel state and apply it. Everything
// around it (informers, trackers, the runner, conntrack, health, metrics)
// is the same for every mode; see syncGroup.
//
// An iptables backend serves one family, since each family has tables of
// its own. The IPVS backend serves all of the node's families at once: the
// kernel keeps the virtual servers and ipsets of both in one table, which
// ipvs.Applier reconciles as a whole.
type backend interface {
	// sync renders ins, one per family the backend serves in the order it
	// was made with, and applies them to the kernel (or, in a dry run,
	// prints them). It returns one outcome per input, whatever the error.
	// An error means the kernel may not match ins; the next sync must put
	// that right, which is the backend's business (the iptables writer
	// makes it a full sync; in IPVS mode every sync is full).
	sync(ctx context.Context, ins []*syncInput) ([]syncOutcome, error)
	// requestFullSync makes the next sync rewrite everything the backend
	// owns, for when another program may have removed it. Safe to call
	// from any goroutine.
	requestFullSync()
	// run does the backend's work between syncs until ctx is done:
	// watching for other programs removing its kernel state, and calling
	// lost when they do, or finishing what a sync started. A backend with
	// nothing to do returns at once.
	run(ctx context.Context, lost func())
}

// syncInput is what a backend renders for one family: the maps, already
// brought up to date by the trackers, and what that update changed.
type syncInput struct {
	family          v1.IPFamily
	services        changetracker.ServicePortMap
	endpoints       changetracker.EndpointsMap
	serviceChanges  changetracker.UpdateServiceMapResult
	endpointChanges changetracker.UpdateEndpointsMapResult
	nodeLabels      map[string]string
}

// syncOutcome is what a backend did for one family, for metrics and logs.
type syncOutcome struct {
	// full is true when everything was rewritten.
	full bool
	// servicePorts counts the service ports the backend now programs, and
	// endpoints what it sends their traffic to: endpoint chains in
	// iptables mode, real servers in IPVS mode.
	servicePorts, endpoints int
	// noLocalInternal and noLocalExternal count the service ports whose
	// internal (external) traffic is dropped for want of an endpoint on
	// this node.
	noLocalInternal, noLocalExternal int
}
