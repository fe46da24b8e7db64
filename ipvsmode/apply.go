package ipvsmode

import (
	"context"
	"errors"
	"fmt"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvs"
)

// Applier programs a node with the [SyncResult] of each of its IP
// families, in the order IPVS mode needs: the ipsets first, since the
// rules match on them; then, per family, the jump rules (SyncResult.JumpRules)
// and the iptables payload; then the virtual servers and the dummy
// interface's addresses, so that a new service address starts taking
// traffic only once its rules are in place.
//
// The kernel holds the virtual servers and ipsets of both families in one
// table, and the reconcilers own all of them, so every Apply must be given
// the translations of every family the node serves: the virtual servers
// and sets of a family left out are deleted.
//
// IPVS mode shares chain names (KUBE-SERVICES, KUBE-POSTROUTING,
// KUBE-MARK-MASQ, KUBE-FORWARD, KUBE-PROXY-FIREWALL) with the iptables
// rule writer's layout. A node that ran the iptables mode before should
// have that mode's rules cleaned up before the first Apply, or its
// KUBE-NODEPORTS and KUBE-EXTERNAL-SERVICES rules and per-service chains
// stay behind.
//
// An Applier is not safe for concurrent use.
type Applier struct {
	ipvs *ipvs.Reconciler
	sets *ipset.Reconciler
	ipt  map[v1.IPFamily]iptables.Interface

	services []ipvs.Service
	desired  []ipset.Desired
}

// ApplyResult says what an [Applier.Apply] call did.
type ApplyResult struct {
	// IPSets is what the ipset reconciler did.
	IPSets ipset.Result
	// IPVS is what the IPVS reconciler did.
	IPVS ipvs.Result
	// RestoreFailed lists the families whose payload iptables-restore
	// refused or failed to run, in the order of the translations: what
	// kube-proxy counts in its
	// sync_proxy_rules_iptables_restore_failures_total metric.
	RestoreFailed []v1.IPFamily
}

// NewApplier returns an applier that reconciles virtual servers with
// ipvs, sets with sets (made with [SetPrefix], or the Names.SetPrefix
// of the translations' ChainPrefix) and applies each family's
// rules with the one of ipts whose Family is that family.
func NewApplier(ipvs *ipvs.Reconciler, sets *ipset.Reconciler, ipts ...iptables.Interface) *Applier {
	a := &Applier{ipvs: ipvs, sets: sets, ipt: map[v1.IPFamily]iptables.Interface{}}
	for _, ipt := range ipts {
		switch ipt.Family() {
		case v1.IPv4Protocol:
			a.ipt[v1.IPv4Protocol] = ipt
		case v1.IPv6Protocol:
			a.ipt[v1.IPv6Protocol] = ipt
		}
	}
	return a
}

// Apply programs translations, one per family. A failed step does not stop
// the later ones (a resync repairs what failed); the error joins each
// step's error, naming the step and family. A translation of a family
// with no iptables Interface is an error, and its rules are not applied.
func (a *Applier) Apply(ctx context.Context, translations ...SyncResult) (ApplyResult, error) {
	var res ApplyResult
	var errs []error
	a.desired = a.desired[:0]
	a.services = a.services[:0]
	for i := range translations {
		a.desired = append(a.desired, translations[i].Sets...)
		a.services = append(a.services, translations[i].Services...)
	}

	var err error
	if res.IPSets, err = a.sets.Reconcile(ctx, a.desired); err != nil {
		errs = append(errs, fmt.Errorf("IPVS mode: ipsets: %w", err))
	}
	for i := range translations {
		tr := &translations[i]
		ipt := a.ipt[tr.Family]
		if ipt == nil {
			errs = append(errs, fmt.Errorf("IPVS mode: no iptables for %s", tr.Family))
			continue
		}
		jumps := tr.JumpRules
		if jumps == nil {
			jumps = DefaultNames().JumpRules()
		}
		if err := iptables.EnsureJumps(ctx, ipt, jumps); err != nil {
			errs = append(errs, fmt.Errorf("IPVS mode: %s jump rules: %w", tr.Family, err))
		}
		if err := ipt.RestoreAll(ctx, tr.Payload, iptables.NoFlushTables, iptables.RestoreCounters); err != nil {
			errs = append(errs, fmt.Errorf("IPVS mode: %s rules: %w", tr.Family, err))
			res.RestoreFailed = append(res.RestoreFailed, tr.Family)
		}
	}
	if res.IPVS, err = a.ipvs.Reconcile(ctx, a.services); err != nil {
		errs = append(errs, fmt.Errorf("IPVS mode: virtual servers: %w", err))
	}
	return res, errors.Join(errs...)
}
