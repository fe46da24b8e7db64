// Package ipvstest provides strict in-memory fakes of [ipvs.Interface] (with
// [ipvs.Batcher]) and [ipvs.AddressBinder] for unit tests of code that
// manages IPVS.
package ipvstest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/proxykit/proxykit/ipvs"
)

// Fake is an in-memory [ipvs.Interface] and [ipvs.Batcher] that checks what
// the kernel checks and fails where the kernel fails, with the same error
// kinds: arguments are validated, adding an existing virtual or real server
// fails with [ipvs.ErrAlreadyExists], and updating or deleting a missing one,
// or adding a real server to a missing virtual server, fails with
// [ipvs.ErrNotFound]. Like the kernel, it lists no real servers (and no
// error) for a virtual server that does not exist, and reports virtual
// servers in normalized form ([ipvs.VirtualServer.Normalized]).
//
// Connection counts are zero unless a test sets them with
// [Fake.SetConnections]; deleting a real server drops them. Schedulers the
// test removed with [Fake.SetSchedulers] fail like a scheduler whose module
// is not loaded.
//
// The zero value is not usable; make one with [NewFake]. It is safe for
// concurrent use.
type Fake struct {
	mu         sync.Mutex
	services   map[vsKey]*fakeService
	timeouts   ipvs.Timeouts
	schedulers map[string]bool
	counts     Counts
}

type vsKey struct {
	addr  netip.Addr
	proto string
	port  uint16
}

type rsKey struct {
	addr netip.Addr
	port uint16
}

type fakeService struct {
	vs ipvs.VirtualServer
	rs map[rsKey]ipvs.RealServer
}

func keyOf(vs ipvs.VirtualServer) vsKey { return vsKey{vs.Address, string(vs.Protocol), vs.Port} }
func rsKeyOf(rs ipvs.RealServer) rsKey  { return rsKey{rs.Address, rs.Port} }

var (
	_ ipvs.Interface = (*Fake)(nil)
	_ ipvs.Batcher   = (*Fake)(nil)
)

// Counts is the number of calls of each kind a [Fake] served since it was
// made or last reset; ops of a batch count as their kinds, and failed calls
// count too. Calls refused as invalid before reaching the "kernel" are not
// counted.
type Counts struct {
	// Virtual server writes, by method or op kind.
	AddVirtualServer, UpdateVirtualServer, DeleteVirtualServer int
	// Real server writes, by method or op kind.
	AddRealServer, UpdateRealServer, DeleteRealServer int
	// Other writes.
	Flush, SetTimeouts int
	// Reads, by method.
	GetVirtualServer, ListVirtualServers, ListRealServers, Timeouts int
	// Batches is the number of ApplyBatch calls.
	Batches int
}

// Writes returns the number of calls that change state (or try to).
func (c Counts) Writes() int {
	return c.AddVirtualServer + c.UpdateVirtualServer + c.DeleteVirtualServer +
		c.AddRealServer + c.UpdateRealServer + c.DeleteRealServer + c.Flush + c.SetTimeouts
}

// DefaultTimeouts are the kernel's timeouts in a new network namespace.
var DefaultTimeouts = ipvs.Timeouts{TCP: 900 * time.Second, TCPFin: 120 * time.Second, UDP: 300 * time.Second}

// NewFake returns an empty fake with the kernel's default timeouts in which
// every scheduler is available.
func NewFake() *Fake {
	return &Fake{services: map[vsKey]*fakeService{}, timeouts: DefaultTimeouts}
}

// SetSchedulers makes only the named schedulers available, as if only their
// modules were loaded; no names makes every scheduler available again.
func (f *Fake) SetSchedulers(names ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.schedulers = nil
	if len(names) > 0 {
		f.schedulers = map[string]bool{}
		for _, n := range names {
			f.schedulers[n] = true
		}
	}
}

// Counts returns the calls served so far.
func (f *Fake) Counts() Counts {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts
}

// ResetCounts sets every count back to zero.
func (f *Fake) ResetCounts() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts = Counts{}
}

// SetConnections sets the active and inactive connection counts the fake
// reports for real server rs of vs. It returns an error wrapping
// [ipvs.ErrNotFound] if either does not exist.
func (f *Fake) SetConnections(vs ipvs.VirtualServer, rs ipvs.RealServer, active, inactive int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.services[keyOf(vs)]
	if !ok {
		return fmt.Errorf("virtual server %s: %w", vs, ipvs.ErrNotFound)
	}
	cur, ok := s.rs[rsKeyOf(rs)]
	if !ok {
		return fmt.Errorf("real server %s of %s: %w", rs, vs, ipvs.ErrNotFound)
	}
	cur.ActiveConn, cur.InactiveConn = active, inactive
	s.rs[rsKeyOf(rs)] = cur
	return nil
}

func (f *Fake) checkScheduler(vs ipvs.VirtualServer) error {
	sched := vs.Normalized().Scheduler
	if f.schedulers != nil && !f.schedulers[sched] {
		return fmt.Errorf("virtual server %s: %w: scheduler %s not available", vs, ipvs.ErrNotSupported, sched)
	}
	return nil
}

// AddVirtualServer is part of [ipvs.Interface].
func (f *Fake) AddVirtualServer(ctx context.Context, vs ipvs.VirtualServer) error {
	return f.apply(ipvs.Op{Kind: ipvs.AddVirtualServer, VirtualServer: vs})
}

// UpdateVirtualServer is part of [ipvs.Interface].
func (f *Fake) UpdateVirtualServer(ctx context.Context, vs ipvs.VirtualServer) error {
	return f.apply(ipvs.Op{Kind: ipvs.UpdateVirtualServer, VirtualServer: vs})
}

// DeleteVirtualServer is part of [ipvs.Interface].
func (f *Fake) DeleteVirtualServer(ctx context.Context, vs ipvs.VirtualServer) error {
	return f.apply(ipvs.Op{Kind: ipvs.DeleteVirtualServer, VirtualServer: vs})
}

// AddRealServer is part of [ipvs.Interface].
func (f *Fake) AddRealServer(ctx context.Context, vs ipvs.VirtualServer, rs ipvs.RealServer) error {
	return f.apply(ipvs.Op{Kind: ipvs.AddRealServer, VirtualServer: vs, RealServer: rs})
}

// UpdateRealServer is part of [ipvs.Interface].
func (f *Fake) UpdateRealServer(ctx context.Context, vs ipvs.VirtualServer, rs ipvs.RealServer) error {
	return f.apply(ipvs.Op{Kind: ipvs.UpdateRealServer, VirtualServer: vs, RealServer: rs})
}

// DeleteRealServer is part of [ipvs.Interface].
func (f *Fake) DeleteRealServer(ctx context.Context, vs ipvs.VirtualServer, rs ipvs.RealServer) error {
	return f.apply(ipvs.Op{Kind: ipvs.DeleteRealServer, VirtualServer: vs, RealServer: rs})
}

// ApplyBatch is part of [ipvs.Batcher].
func (f *Fake) ApplyBatch(ctx context.Context, ops []ipvs.Op) error {
	f.mu.Lock()
	f.counts.Batches++
	f.mu.Unlock()
	var failed []ipvs.OpError
	for i, op := range ops {
		if err := f.apply(op); err != nil {
			failed = append(failed, ipvs.OpError{Index: i, Op: op, Err: err})
		}
	}
	if len(failed) > 0 {
		return &ipvs.BatchError{Failed: failed}
	}
	return nil
}

// apply validates and performs one write.
func (f *Fake) apply(op ipvs.Op) error {
	if err := op.VirtualServer.Validate(); err != nil {
		return err
	}
	if op.Kind >= ipvs.AddRealServer {
		if err := op.RealServer.Validate(op.VirtualServer); err != nil {
			return err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	vs, rs := op.VirtualServer, op.RealServer
	s, exists := f.services[keyOf(vs)]
	fail := func(kind error) error { return fmt.Errorf("%s: %w", op, kind) }
	switch op.Kind {
	case ipvs.AddVirtualServer:
		f.counts.AddVirtualServer++
		if exists {
			return fail(ipvs.ErrAlreadyExists)
		}
		if err := f.checkScheduler(vs); err != nil {
			return err
		}
		f.services[keyOf(vs)] = &fakeService{vs: vs.Normalized(), rs: map[rsKey]ipvs.RealServer{}}
		return nil
	case ipvs.UpdateVirtualServer:
		f.counts.UpdateVirtualServer++
		if !exists {
			return fail(ipvs.ErrNotFound)
		}
		if err := f.checkScheduler(vs); err != nil {
			return err
		}
		s.vs = vs.Normalized()
		return nil
	case ipvs.DeleteVirtualServer:
		f.counts.DeleteVirtualServer++
		if !exists {
			return fail(ipvs.ErrNotFound)
		}
		delete(f.services, keyOf(vs))
		return nil
	case ipvs.AddRealServer:
		f.counts.AddRealServer++
	case ipvs.UpdateRealServer:
		f.counts.UpdateRealServer++
	case ipvs.DeleteRealServer:
		f.counts.DeleteRealServer++
	default:
		return fmt.Errorf("%s: %w: unknown op kind", op, ipvs.ErrInvalid)
	}
	if !exists {
		return fail(ipvs.ErrNotFound)
	}
	cur, has := s.rs[rsKeyOf(rs)]
	switch {
	case op.Kind == ipvs.AddRealServer && has:
		return fail(ipvs.ErrAlreadyExists)
	case op.Kind == ipvs.AddRealServer:
		rs.ActiveConn, rs.InactiveConn = 0, 0
		s.rs[rsKeyOf(rs)] = rs
	case !has:
		return fail(ipvs.ErrNotFound)
	case op.Kind == ipvs.UpdateRealServer:
		cur.Weight = rs.Weight
		s.rs[rsKeyOf(rs)] = cur
	default:
		delete(s.rs, rsKeyOf(rs))
	}
	return nil
}

// GetVirtualServer is part of [ipvs.Interface].
func (f *Fake) GetVirtualServer(ctx context.Context, vs ipvs.VirtualServer) (ipvs.VirtualServer, error) {
	if err := identity(vs).Validate(); err != nil {
		return ipvs.VirtualServer{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts.GetVirtualServer++
	s, ok := f.services[keyOf(vs)]
	if !ok {
		return ipvs.VirtualServer{}, fmt.Errorf("getting virtual server %s: %w", vs, ipvs.ErrNotFound)
	}
	return s.vs, nil
}

func identity(vs ipvs.VirtualServer) ipvs.VirtualServer {
	return ipvs.VirtualServer{Address: vs.Address, Protocol: vs.Protocol, Port: vs.Port}
}

// ListVirtualServers is part of [ipvs.Interface]. The fake lists them
// ordered by address, protocol and port.
func (f *Fake) ListVirtualServers(ctx context.Context) ([]ipvs.VirtualServer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts.ListVirtualServers++
	list := make([]ipvs.VirtualServer, 0, len(f.services))
	for _, s := range f.services {
		list = append(list, s.vs)
	}
	slices.SortFunc(list, compareVS)
	return list, nil
}

func compareVS(a, b ipvs.VirtualServer) int {
	return cmp.Or(a.Address.Compare(b.Address), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port))
}

// Flush is part of [ipvs.Interface].
func (f *Fake) Flush(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts.Flush++
	clear(f.services)
	return nil
}

// ListRealServers is part of [ipvs.Interface]. The fake lists them ordered
// by address and port.
func (f *Fake) ListRealServers(ctx context.Context, vs ipvs.VirtualServer) ([]ipvs.RealServer, error) {
	if err := identity(vs).Validate(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts.ListRealServers++
	s, ok := f.services[keyOf(vs)]
	if !ok {
		return []ipvs.RealServer{}, nil
	}
	return sortedRS(s), nil
}

func sortedRS(s *fakeService) []ipvs.RealServer {
	list := make([]ipvs.RealServer, 0, len(s.rs))
	for _, rs := range s.rs {
		list = append(list, rs)
	}
	slices.SortFunc(list, func(a, b ipvs.RealServer) int {
		return cmp.Or(a.Address.Compare(b.Address), cmp.Compare(a.Port, b.Port))
	})
	return list
}

// SetTimeouts is part of [ipvs.Interface].
func (f *Fake) SetTimeouts(ctx context.Context, t ipvs.Timeouts) error {
	// As the kernel implementation: refused before it is sent.
	if err := t.Validate(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts.SetTimeouts++
	if t.TCP != 0 {
		f.timeouts.TCP = t.TCP
	}
	if t.TCPFin != 0 {
		f.timeouts.TCPFin = t.TCPFin
	}
	if t.UDP != 0 {
		f.timeouts.UDP = t.UDP
	}
	return nil
}

// Timeouts is part of [ipvs.Interface].
func (f *Fake) Timeouts(ctx context.Context) (ipvs.Timeouts, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts.Timeouts++
	return f.timeouts, nil
}

// Dump returns the virtual and real servers, ordered, one per line:
//
//	TCP 10.96.0.1:80 rr
//	  -> 10.244.0.1:8080 weight 1
//	UDP 10.96.0.10:53 sh flags 0x10 persistent 10800
//	  -> 10.244.0.2:53 weight 0 active 2 inactive 1
//
// Flags other than persistence print in hex; connection counts print only
// when not zero.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	list := make([]*fakeService, 0, len(f.services))
	for _, s := range f.services {
		list = append(list, s)
	}
	slices.SortFunc(list, func(a, b *fakeService) int { return compareVS(a.vs, b.vs) })
	var b strings.Builder
	for _, s := range list {
		vs := s.vs
		fmt.Fprintf(&b, "%s %s %s", vs.Protocol, netip.AddrPortFrom(vs.Address, vs.Port), vs.Scheduler)
		if other := vs.Flags &^ ipvs.FlagPersistent; other != 0 {
			fmt.Fprintf(&b, " flags %#x", uint32(other))
		}
		if vs.Flags&ipvs.FlagPersistent != 0 {
			fmt.Fprintf(&b, " persistent %d", vs.Timeout)
		}
		b.WriteByte('\n')
		for _, rs := range sortedRS(s) {
			fmt.Fprintf(&b, "  -> %s weight %d", rs, rs.Weight)
			if rs.ActiveConn != 0 || rs.InactiveConn != 0 {
				fmt.Fprintf(&b, " active %d inactive %d", rs.ActiveConn, rs.InactiveConn)
			}
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// Binder is an in-memory [ipvs.AddressBinder] that fails where the kernel
// fails: binding an address twice, unbinding one that is not bound, or
// using an interface that does not exist. The zero value is not usable;
// make one with [NewBinder]. It is safe for concurrent use.
type Binder struct {
	mu      sync.Mutex
	devices map[string]map[netip.Addr]bool
	others  map[string]bool
	writes  int
}

var _ ipvs.AddressBinder = (*Binder)(nil)

// NewBinder returns a binder with no interfaces.
func NewBinder() *Binder {
	return &Binder{devices: map[string]map[netip.Addr]bool{}, others: map[string]bool{}}
}

// AddOtherLink makes a link that is not a dummy interface, such as a
// bridge, exist under name.
func (b *Binder) AddOtherLink(name string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.others[name] = true
}

// Writes returns how many calls changed, or tried to change, interfaces or
// addresses.
func (b *Binder) Writes() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.writes
}

// EnsureDevice is part of [ipvs.AddressBinder].
func (b *Binder) EnsureDevice(ctx context.Context, name string) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.others[name] {
		return false, fmt.Errorf("dummy interface %s: a link of that name exists and is not a dummy interface", name)
	}
	if _, ok := b.devices[name]; ok {
		return false, nil
	}
	b.writes++
	b.devices[name] = map[netip.Addr]bool{}
	return true, nil
}

// DeleteDevice is part of [ipvs.AddressBinder].
func (b *Binder) DeleteDevice(ctx context.Context, name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.devices[name]; ok {
		b.writes++
		delete(b.devices, name)
	}
	return nil
}

// Addresses is part of [ipvs.AddressBinder]. The fake returns them sorted.
func (b *Binder) Addresses(ctx context.Context, name string) ([]netip.Addr, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	dev, ok := b.devices[name]
	if !ok {
		return nil, fmt.Errorf("dummy interface %s: %w", name, ipvs.ErrNotFound)
	}
	list := make([]netip.Addr, 0, len(dev))
	for a := range dev {
		list = append(list, a)
	}
	slices.SortFunc(list, netip.Addr.Compare)
	return list, nil
}

// Bind is part of [ipvs.AddressBinder].
func (b *Binder) Bind(ctx context.Context, name string, addrs ...netip.Addr) error {
	return b.change(name, addrs, true)
}

// Unbind is part of [ipvs.AddressBinder].
func (b *Binder) Unbind(ctx context.Context, name string, addrs ...netip.Addr) error {
	return b.change(name, addrs, false)
}

func (b *Binder) change(name string, addrs []netip.Addr, bind bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	dev, ok := b.devices[name]
	if !ok {
		return fmt.Errorf("dummy interface %s: %w", name, ipvs.ErrNotFound)
	}
	verb := map[bool]string{true: "binding", false: "unbinding"}[bind]
	var errs []error
	for _, addr := range addrs {
		if !addr.IsValid() || addr.Is4In6() || addr.Zone() != "" {
			errs = append(errs, fmt.Errorf("%s %s on %s: %w", verb, addr, name, ipvs.ErrInvalid))
			continue
		}
		b.writes++
		switch {
		case bind && dev[addr]:
			errs = append(errs, fmt.Errorf("%s %s on %s: %w", verb, addr, name, ipvs.ErrAlreadyExists))
		case !bind && !dev[addr]:
			errs = append(errs, fmt.Errorf("%s %s on %s: %w", verb, addr, name, ipvs.ErrNotFound))
		case bind:
			dev[addr] = true
		default:
			delete(dev, addr)
		}
	}
	return errors.Join(errs...)
}
