package main

import (
	"context"

	"github.com/proxykit/proxykit/changetracker"
)

// backend is what a proxy mode does for one IP family: turn the service
// and endpoint maps into kernel state and apply it. Everything around it
// (informers, trackers, the runner, conntrack, health, metrics) is the
// same for every mode; see familyProxier.sync.
type backend interface {
	// sync renders in and applies it to the kernel (or, in a dry run,
	// prints it). An error means the kernel may not match in; the next
	// sync must put that right, which is the backend's business (the
	// iptables writer makes it a full sync).
	sync(ctx context.Context, in *syncInput) (syncOutcome, error)
	// requestFullSync makes the next sync rewrite everything the backend
	// owns, for when another program may have removed it. Safe to call
	// from any goroutine.
	requestFullSync()
	// monitor watches, until ctx is done, for other programs removing the
	// backend's kernel state and calls lost when they do. A backend that
	// cannot tell returns at once.
	monitor(ctx context.Context, lost func())
}

// syncInput is what a backend renders: the maps, already brought up to date
// by the trackers, and what that update changed.
type syncInput struct {
	services        changetracker.ServicePortMap
	endpoints       changetracker.EndpointsMap
	serviceChanges  changetracker.UpdateServiceMapResult
	endpointChanges changetracker.UpdateEndpointsMapResult
	nodeLabels      map[string]string
}

// syncOutcome is what a backend did, for metrics and logs.
type syncOutcome struct {
	// full is true when everything was rewritten.
	full bool
	// servicePorts and endpoints count what the backend now programs.
	servicePorts, endpoints int
	// noLocalInternal and noLocalExternal count the service ports whose
	// internal (external) traffic is dropped for want of an endpoint on
	// this node.
	noLocalInternal, noLocalExternal int
}
