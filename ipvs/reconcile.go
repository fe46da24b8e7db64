package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Service is a virtual server as a caller wants it, with its real servers.
type Service struct {
	// VirtualServer is the virtual server and its settings.
	VirtualServer VirtualServer
	// RealServers are its real servers with their weights. Order does not
	// matter; the connection counts are ignored.
	RealServers []RealServer
	// Bind asks for the virtual server's address to be bound to the dummy
	// interface, so that the node accepts packets for it: true for cluster
	// IPs, external IPs and load-balancer IPs, false for node ports (whose
	// addresses are the node's own).
	Bind bool
}

// Result counts what a [Reconciler.Reconcile] call did.
type Result struct {
	// Virtual servers added, updated (settings changed) and deleted.
	VirtualServersAdded, VirtualServersUpdated, VirtualServersDeleted int
	// Real servers added, updated (weight changed) and deleted at once.
	RealServersAdded, RealServersUpdated, RealServersDeleted int
	// RealServersDraining counts real servers whose graceful termination
	// started in this call.
	RealServersDraining int
	// Addresses bound to and unbound from the dummy interface.
	AddressesBound, AddressesUnbound int
	// DeviceCreated says whether the dummy interface was created.
	DeviceCreated bool
	// RealServerLists counts the virtual servers whose real servers were
	// read from the kernel (the others were known from the previous call;
	// see [WithFullSyncPeriod]).
	RealServerLists int
	// Writes is the number of calls that changed, or tried to change, the
	// kernel's state.
	Writes int
}

// Reconciler makes the kernel's IPVS virtual servers, their real servers
// and the addresses of the dummy interface match a desired list of
// services with as few netlink writes as it can; a call with nothing to
// change writes nothing.
//
// It owns every virtual server of its namespace except those in the
// excluded CIDRs ([WithExcludeCIDRs]) and firewall-mark ones, and every
// address of the dummy interface: whatever it finds there that is not
// desired is removed. Real servers that are no longer wanted go through
// its [GracefulTerminator]; deleted virtual servers drop theirs at once.
//
// Calls must not run concurrently with each other. It remembers what it
// applied, for [WithFullSyncPeriod]; nothing else carries over between
// calls, so a restarted proxier resumes from the kernel's state.
type Reconciler struct {
	iface      Interface
	binder     AddressBinder
	device     string
	exclude    []netip.Prefix
	term       *GracefulTerminator
	clock      clock.PassiveClock
	fullPeriod time.Duration

	lastFull time.Time
	applied  map[key]appliedService
	// bound are the addresses on the dummy interface after the last call,
	// if it bound and unbound without error.
	bound map[netip.Addr]bool
}

// appliedService is what the reconciler last wrote for a virtual server,
// its real servers sorted.
type appliedService struct {
	vs VirtualServer
	rs []RealServer
}

// WithDummyDevice sets the name of the dummy interface; the default is
// [DummyDevice], kube-ipvs0. Read by [NewReconciler] only.
func WithDummyDevice(name string) Option {
	return func(o *options) { o.device = name }
}

// WithExcludeCIDRs leaves alone the kernel's virtual servers whose
// addresses are in cidrs, as kube-proxy's --ipvs-exclude-cidrs does: they
// are never deleted, even if not desired. Read by [NewReconciler] only.
func WithExcludeCIDRs(cidrs ...netip.Prefix) Option {
	return func(o *options) { o.exclude = append(o.exclude, cidrs...) }
}

// WithGracefulTerminator sets the terminator that removes real servers;
// the default is a new one over the reconciler's Interface, made with the
// options given to NewReconciler. Run its sweep loop
// ([GracefulTerminator.Run]) beside the reconciler. Read by
// [NewReconciler] only.
func WithGracefulTerminator(g *GracefulTerminator) Option {
	return func(o *options) { o.term = g }
}

// WithFullSyncPeriod lets the reconciler trust what it applied itself for
// up to d: a virtual server whose settings in the kernel are those it
// applied, with no real server draining, is diffed against what it wrote
// instead of against a fresh listing of its real servers. Every d, and on
// the first call, every virtual server's real servers are read again, which
// repairs changes made by others. Reading real servers costs one netlink
// dump per virtual server, the bulk of a no-change resync at 10,000
// services. The default, 0, reads them on every call, as kube-proxy does.
// Read by [NewReconciler] only.
func WithFullSyncPeriod(d time.Duration) Option {
	return func(o *options) { o.fullSyncPeriod = d }
}

// NewReconciler returns a reconciler of iface's virtual servers and of the
// addresses binder holds on the dummy interface. A nil binder leaves
// addresses alone. It reads [WithDummyDevice], [WithExcludeCIDRs],
// [WithGracefulTerminator], [WithFullSyncPeriod] and [WithClock]; without
// WithGracefulTerminator it makes its terminator with all of opts, so that
// [WithClock] and [WithSweepPeriod] reach it.
func NewReconciler(iface Interface, binder AddressBinder, opts ...Option) *Reconciler {
	o := newOptions(opts)
	r := &Reconciler{
		iface: iface, binder: binder, device: o.device, exclude: o.exclude, term: o.term,
		fullPeriod: o.fullSyncPeriod, clock: o.clock, applied: map[key]appliedService{},
	}
	if r.term == nil {
		r.term = NewGracefulTerminator(iface, opts...)
	}
	return r
}

// Terminator returns the reconciler's graceful terminator.
func (r *Reconciler) Terminator() *GracefulTerminator { return r.term }

func (r *Reconciler) excluded(a netip.Addr) bool {
	for _, p := range r.exclude {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// desiredService is a validated service, its real servers sorted by
// address and port, without duplicates.
type desiredService struct {
	vs   VirtualServer
	rs   []RealServer
	bind bool
}

// Reconcile makes the kernel match services:
//
//   - missing virtual servers are added with their real servers, and those
//     whose settings differ are updated;
//   - missing real servers are added and those whose weight differs are
//     updated (a real server left at weight 0 by an earlier termination
//     gets its weight back, and its termination is cancelled);
//   - real servers that are not wanted are handed to the graceful
//     terminator;
//   - owned virtual servers that are not wanted are deleted;
//   - the dummy interface is created if missing, and exactly the addresses
//     of services with Bind are bound to it.
//
// Invalid input is skipped, not applied: a service whose virtual server is
// invalid or listed twice is left as it is in the kernel, and an invalid or
// repeated real server is left out of its service; the rest is reconciled
// and the returned error names each skipped item. Kernel errors for one
// item do not stop the others; they are joined in the returned error.
func (r *Reconciler) Reconcile(ctx context.Context, services []Service) (Result, error) {
	var res Result
	logger := klog.FromContext(ctx)
	desired, index, errs := validateServices(services)

	current, err := r.iface.ListVirtualServers(ctx)
	if err != nil {
		return res, err
	}
	now := r.clock.Now()
	full := r.fullPeriod <= 0 || r.lastFull.IsZero() || now.Sub(r.lastFull) >= r.fullPeriod
	kernel := make(map[key]VirtualServer, len(current))
	for _, vs := range current {
		kernel[vs.key()] = vs
	}

	// Addresses first, so that a new virtual server is reachable as soon
	// as it exists.
	var (
		bound           []netip.Addr
		want            map[netip.Addr]bool
		bindOK, addrErr bool
	)
	if r.binder != nil {
		want = wantedAddresses(desired)
		bound, err = r.bindAddresses(ctx, want, full, &res)
		bindOK = bound != nil || err == nil
		if err != nil {
			errs = append(errs, err)
			addrErr = true
		}
	}

	var ops []Op
	type termination struct {
		vs VirtualServer
		rs RealServer
	}
	var terminate []termination
	for _, d := range desired {
		k := d.vs.key()
		cur, exists := kernel[k]
		if !exists {
			ops = append(ops, Op{Kind: AddVirtualServer, VirtualServer: d.vs})
			for _, rs := range d.rs {
				ops = append(ops, Op{Kind: AddRealServer, VirtualServer: d.vs, RealServer: rs})
			}
			continue
		}
		if !cur.Equal(d.vs) {
			ops = append(ops, Op{Kind: UpdateVirtualServer, VirtualServer: d.vs})
		}
		have, err := r.realServers(ctx, k, cur, d, full, &res)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		draining := r.term.draining(k)
		mergeRS(d.rs, have, func(want, h *RealServer) {
			switch {
			case h == nil:
				ops = append(ops, Op{Kind: AddRealServer, VirtualServer: d.vs, RealServer: *want})
			case want == nil:
				if !draining || !r.term.InProgress(d.vs, *h) {
					terminate = append(terminate, termination{d.vs, *h})
				}
			default:
				if draining && r.term.Cancel(d.vs, *want) {
					logger.V(4).Info("Real server wanted again; termination cancelled", "virtualServer", d.vs, "realServer", want)
				}
				if h.Weight != want.Weight {
					ops = append(ops, Op{Kind: UpdateRealServer, VirtualServer: d.vs, RealServer: *want})
				}
			}
		})
	}
	stale := make([]VirtualServer, 0)
	for k, vs := range kernel {
		if _, ok := index[k]; !ok && !r.excluded(vs.Address) {
			stale = append(stale, vs)
		}
	}
	slices.SortFunc(stale, compareVS)
	for _, vs := range stale {
		ops = append(ops, Op{Kind: DeleteVirtualServer, VirtualServer: vs})
	}

	failed, applyErrs := r.apply(ctx, ops, &res)
	errs = append(errs, applyErrs...)
	for _, vs := range stale {
		r.term.Forget(vs)
		delete(r.applied, vs.key())
	}

	for _, t := range terminate {
		how, err := r.term.Terminate(ctx, t.vs, t.rs)
		switch {
		case err != nil:
			errs = append(errs, err)
			failed[t.vs.key()] = true
		case how == TerminationDeleted:
			res.Writes++
			res.RealServersDeleted++
		case how == TerminationDraining:
			if t.rs.Weight != 0 {
				res.Writes++
			}
			res.RealServersDraining++
		}
	}

	for _, d := range desired {
		k := d.vs.key()
		if failed[k] {
			delete(r.applied, k)
			continue
		}
		vs := d.vs.Normalized()
		if a, ok := r.applied[k]; !ok || a.vs != vs || !slices.Equal(a.rs, d.rs) {
			// A copy: d.rs may be the caller's slice.
			r.applied[k] = appliedService{vs: vs, rs: slices.Clone(d.rs)}
		}
	}
	if bindOK {
		if err := r.unbindAddresses(ctx, bound, want, &res); err != nil {
			errs = append(errs, err)
			addrErr = true
		}
	}
	r.bound = nil
	if bindOK && !addrErr {
		r.bound = want
	}
	if full && len(errs) == 0 {
		r.lastFull = now
	}
	logger.V(2).Info("IPVS reconciled", "services", len(desired), "writes", res.Writes,
		"realServerLists", res.RealServerLists)
	return res, errors.Join(errs...)
}

// validateServices returns the valid services in the order given, their
// positions by identity, and an error for each item skipped.
func validateServices(services []Service) ([]desiredService, map[key]int, []error) {
	var errs []error
	desired := make([]desiredService, 0, len(services))
	index := make(map[key]int, len(services))
	dup := map[key]bool{}
	for _, s := range services {
		k := s.VirtualServer.key()
		if err := s.VirtualServer.Validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		if _, ok := index[k]; ok || dup[k] {
			errs = append(errs, fmt.Errorf("virtual server %s: %w: listed twice; left as it is", s.VirtualServer, ErrInvalid))
			dup[k] = true
			continue
		}
		d := desiredService{vs: s.VirtualServer, bind: s.Bind}
		if clean(s) {
			// The common case, without a copy; never written to.
			d.rs = s.RealServers
			index[k] = len(desired)
			desired = append(desired, d)
			continue
		}
		d.rs = make([]RealServer, 0, len(s.RealServers))
		for _, rs := range s.RealServers {
			if err := rs.Validate(s.VirtualServer); err != nil {
				errs = append(errs, err)
				continue
			}
			rs.ActiveConn, rs.InactiveConn = 0, 0
			d.rs = append(d.rs, rs)
		}
		sortRS(d.rs)
		d.rs = slices.CompactFunc(d.rs, func(a, b RealServer) bool {
			if a.key() != b.key() {
				return false
			}
			errs = append(errs, fmt.Errorf("real server %s of %s: %w: listed twice; the first is used", b, s.VirtualServer, ErrInvalid))
			return true
		})
		index[k] = len(desired)
		desired = append(desired, d)
	}
	// A service listed twice is left alone altogether.
	if len(dup) > 0 {
		desired = slices.DeleteFunc(desired, func(d desiredService) bool { return dup[d.vs.key()] })
		clear(index)
		for i, d := range desired {
			index[d.vs.key()] = i
		}
	}
	return desired, index, errs
}

// clean reports whether s's real servers are valid, sorted by address and
// port without repeats, and carry no connection counts.
func clean(s Service) bool {
	for i, rs := range s.RealServers {
		if rs.ActiveConn != 0 || rs.InactiveConn != 0 || rs.Validate(s.VirtualServer) != nil ||
			(i > 0 && compareRS(s.RealServers[i-1], rs) >= 0) {
			return false
		}
	}
	return true
}

// realServers returns the real servers of the existing virtual server cur,
// sorted: what the reconciler applied, if it may trust that, or a fresh
// listing. A listing is needed for a full resync, for a virtual server
// whose kernel settings are not what was applied, with draining real
// servers, or with real servers to terminate (whose connection counts must
// be fresh).
func (r *Reconciler) realServers(ctx context.Context, k key, cur VirtualServer, d desiredService, full bool, res *Result) ([]RealServer, error) {
	if a, ok := r.applied[k]; ok && !full && a.vs == cur.Normalized() && !r.term.draining(k) {
		terminating := false
		mergeRS(d.rs, a.rs, func(want, _ *RealServer) { terminating = terminating || want == nil })
		if !terminating {
			return a.rs, nil
		}
	}
	list, err := r.iface.ListRealServers(ctx, cur)
	res.RealServerLists++
	if err != nil {
		return nil, err
	}
	sortRS(list)
	return list, nil
}

func compareRS(a, b RealServer) int {
	if c := a.Address.Compare(b.Address); c != 0 {
		return c
	}
	return int(a.Port) - int(b.Port)
}

func sortRS(list []RealServer) { slices.SortFunc(list, compareRS) }

// mergeRS walks two lists of real servers sorted by address and port and
// calls fn for each identity in either: with both, or with nil for the one
// that lacks it.
func mergeRS(want, have []RealServer, fn func(want, have *RealServer)) {
	i, j := 0, 0
	for i < len(want) || j < len(have) {
		switch {
		case j == len(have) || (i < len(want) && compareRS(want[i], have[j]) < 0):
			fn(&want[i], nil)
			i++
		case i == len(want) || compareRS(want[i], have[j]) > 0:
			fn(nil, &have[j])
			j++
		default:
			fn(&want[i], &have[j])
			i, j = i+1, j+1
		}
	}
}

// apply performs ops, in a batch if the Interface can, and returns the
// virtual servers with a failed op.
func (r *Reconciler) apply(ctx context.Context, ops []Op, res *Result) (map[key]bool, []error) {
	failed := map[key]bool{}
	var errs []error
	ok := make([]bool, len(ops))
	for i := range ok {
		ok[i] = true
	}
	if b, isBatcher := r.iface.(Batcher); isBatcher {
		err := b.ApplyBatch(ctx, ops)
		var be *BatchError
		switch {
		case errors.As(err, &be):
			for _, f := range be.Failed {
				ok[f.Index] = false
				errs = append(errs, f.Err)
			}
		case err != nil:
			for i := range ok {
				ok[i] = false
			}
			errs = append(errs, err)
		}
	} else {
		for i, op := range ops {
			if err := r.applyOne(ctx, op); err != nil {
				ok[i] = false
				errs = append(errs, err)
			}
		}
	}
	res.Writes += len(ops)
	for i, op := range ops {
		if !ok[i] {
			failed[op.VirtualServer.key()] = true
			continue
		}
		switch op.Kind {
		case AddVirtualServer:
			res.VirtualServersAdded++
		case UpdateVirtualServer:
			res.VirtualServersUpdated++
		case DeleteVirtualServer:
			res.VirtualServersDeleted++
		case AddRealServer:
			res.RealServersAdded++
		case UpdateRealServer:
			res.RealServersUpdated++
		}
	}
	return failed, errs
}

func (r *Reconciler) applyOne(ctx context.Context, op Op) error {
	switch op.Kind {
	case AddVirtualServer:
		return r.iface.AddVirtualServer(ctx, op.VirtualServer)
	case UpdateVirtualServer:
		return r.iface.UpdateVirtualServer(ctx, op.VirtualServer)
	case DeleteVirtualServer:
		return r.iface.DeleteVirtualServer(ctx, op.VirtualServer)
	case AddRealServer:
		return r.iface.AddRealServer(ctx, op.VirtualServer, op.RealServer)
	case UpdateRealServer:
		return r.iface.UpdateRealServer(ctx, op.VirtualServer, op.RealServer)
	case DeleteRealServer:
		return r.iface.DeleteRealServer(ctx, op.VirtualServer, op.RealServer)
	}
	return fmt.Errorf("IPVS op: %w: unknown kind %d", ErrInvalid, op.Kind)
}

// bindAddresses creates the dummy interface if needed and binds the
// addresses of the services with Bind that it lacks. It returns the
// addresses that were bound before, for unbindAddresses. Unless full, it
// trusts what the previous call left, if it knows, instead of looking.
func (r *Reconciler) bindAddresses(ctx context.Context, want map[netip.Addr]bool, full bool, res *Result) ([]netip.Addr, error) {
	var bound []netip.Addr
	if !full && r.bound != nil {
		bound = make([]netip.Addr, 0, len(r.bound))
		for a := range r.bound {
			bound = append(bound, a)
		}
	} else {
		created, err := r.binder.EnsureDevice(ctx, r.device)
		if err != nil {
			return nil, err
		}
		if created {
			res.Writes++
			res.DeviceCreated = true
		}
		if bound, err = r.binder.Addresses(ctx, r.device); err != nil {
			return nil, err
		}
	}
	have := make(map[netip.Addr]bool, len(bound))
	for _, a := range bound {
		have[a] = true
	}
	var add []netip.Addr
	for a := range want {
		if !have[a] {
			add = append(add, a)
		}
	}
	slices.SortFunc(add, netip.Addr.Compare)
	n, err := r.changeAddresses(ctx, add, true, res)
	res.AddressesBound += n
	return bound, err
}

// unbindAddresses unbinds the addresses of bound that no service with Bind
// has. It runs after the virtual servers are written, so that an address
// is never missing while its virtual server exists.
func (r *Reconciler) unbindAddresses(ctx context.Context, bound []netip.Addr, want map[netip.Addr]bool, res *Result) error {
	var drop []netip.Addr
	for _, a := range bound {
		if !want[a] {
			drop = append(drop, a)
		}
	}
	n, err := r.changeAddresses(ctx, drop, false, res)
	res.AddressesUnbound += n
	return err
}

// changeAddresses binds or unbinds addrs in one call and returns how many
// are now as wanted: an address already bound (or already unbound) counts
// as done, not as an error.
func (r *Reconciler) changeAddresses(ctx context.Context, addrs []netip.Addr, bind bool, res *Result) (int, error) {
	if len(addrs) == 0 {
		return 0, nil
	}
	res.Writes += len(addrs)
	var err error
	if bind {
		err = r.binder.Bind(ctx, r.device, addrs...)
	} else {
		err = r.binder.Unbind(ctx, r.device, addrs...)
	}
	if err == nil {
		return len(addrs), nil
	}
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return 0, err // not per address: none was changed
	}
	var errs []error
	for _, e := range joined.Unwrap() {
		if (bind && IsAlreadyExists(e)) || (!bind && IsNotFound(e)) {
			continue
		}
		errs = append(errs, e)
	}
	return len(addrs) - len(errs), errors.Join(errs...)
}

func wantedAddresses(desired []desiredService) map[netip.Addr]bool {
	want := map[netip.Addr]bool{}
	for _, d := range desired {
		if d.bind {
			want[d.vs.Address] = true
		}
	}
	return want
}
