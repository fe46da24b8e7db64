package proxier

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/logsafe"
	"github.com/proxykit/proxykit/proxier/config"
	"github.com/proxykit/proxykit/proxy"
)

// serviceCIDRs keeps the ranges of the cluster's ServiceCIDR objects, by
// family, for proxy.FamilyInput.ServiceCIDRs. It is a config.ServiceCIDRHandler;
// when a family's ranges change it calls changed with the family.
type serviceCIDRs struct {
	logger  klog.Logger
	changed func(v1.IPFamily)

	mu       sync.Mutex
	objects  map[string][]netip.Prefix
	byFamily map[v1.IPFamily][]netip.Prefix
}

var _ config.ServiceCIDRHandler = (*serviceCIDRs)(nil)

func newServiceCIDRs(logger klog.Logger, changed func(v1.IPFamily)) *serviceCIDRs {
	return &serviceCIDRs{logger: logger, changed: changed,
		objects: map[string][]netip.Prefix{}, byFamily: map[v1.IPFamily][]netip.Prefix{}}
}

func (s *serviceCIDRs) OnServiceCIDRAdd(o *networkingv1.ServiceCIDR) { s.set(o) }
func (s *serviceCIDRs) OnServiceCIDRUpdate(_, o *networkingv1.ServiceCIDR) {
	s.set(o)
}
func (s *serviceCIDRs) OnServiceCIDRDelete(o *networkingv1.ServiceCIDR) {
	if o != nil {
		s.apply(o.Name, nil)
	}
}
func (s *serviceCIDRs) OnServiceCIDRsSynced() {}

// set records o's ranges; an object the API server would refuse is
// logged and counts as having none, so that the others still apply.
func (s *serviceCIDRs) set(o *networkingv1.ServiceCIDR) {
	if o == nil {
		return
	}
	ranges, err := serviceCIDRRanges(o)
	if err != nil {
		s.logger.Error(err, "Ignoring a ServiceCIDR the API server would refuse", "serviceCIDR", logsafe.KObj(o))
		ranges = nil
	}
	s.apply(o.Name, ranges)
}

// apply makes ranges the object name's (none: forgets it), and calls
// changed for each family whose ranges that changes.
func (s *serviceCIDRs) apply(name string, ranges []netip.Prefix) {
	s.mu.Lock()
	if ranges == nil {
		delete(s.objects, name)
	} else {
		s.objects[name] = ranges
	}
	next := map[v1.IPFamily][]netip.Prefix{}
	for _, rs := range s.objects {
		for _, p := range rs {
			f := proxy.FamilyOf(p.Addr())
			next[f] = append(next[f], p)
		}
	}
	var changed []v1.IPFamily
	for _, f := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		ps := next[f]
		slices.SortFunc(ps, comparePrefixes)
		ps = slices.Compact(ps)
		if !slices.Equal(ps, s.byFamily[f]) {
			changed = append(changed, f)
			// A new slice: the one syncs were given stays as it was.
			s.byFamily[f] = ps
		}
	}
	s.mu.Unlock()
	for _, f := range changed {
		s.logger.V(2).Info("Service CIDRs changed", "ipFamily", f, "serviceCIDRs", s.forFamily(f))
		s.changed(f)
	}
}

// forFamily returns the family's ranges, sorted, without duplicates; nil
// for a nil s. The slice is never changed afterwards.
func (s *serviceCIDRs) forFamily(f v1.IPFamily) []netip.Prefix {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byFamily[f]
}

func comparePrefixes(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// serviceCIDRRanges returns the ranges of o, checked as the API server
// checks a ServiceCIDR's spec.cidrs: one or two CIDRs, two of different
// families.
func serviceCIDRRanges(o *networkingv1.ServiceCIDR) ([]netip.Prefix, error) {
	cidrs := o.Spec.CIDRs
	switch {
	case len(cidrs) == 0:
		return nil, errors.New("spec.cidrs: at least one CIDR is required")
	case len(cidrs) > 2:
		return nil, fmt.Errorf("spec.cidrs: %d CIDRs, at most 2 (one per IP family)", len(cidrs))
	}
	out := make([]netip.Prefix, 0, len(cidrs))
	for i, s := range cidrs {
		p, ok := changetracker.ParseCIDR(s)
		if !ok {
			return nil, fmt.Errorf("spec.cidrs[%d]: %q is not a CIDR", i, s)
		}
		out = append(out, p)
	}
	if len(out) == 2 && proxy.FamilyOf(out[0].Addr()) == proxy.FamilyOf(out[1].Addr()) {
		return nil, fmt.Errorf("spec.cidrs: %s and %s are both %s; two must be one of each IP family", out[0], out[1], proxy.FamilyOf(out[0].Addr()))
	}
	return out, nil
}
