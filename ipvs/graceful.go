package ipvs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Termination is what [GracefulTerminator.Terminate] did with a real
// server.
type Termination int

const (
	// TerminationDeleted: the real server was deleted at once, because its
	// virtual server is UDP or SCTP or it had no connections.
	TerminationDeleted Termination = iota + 1
	// TerminationDraining: the real server has weight 0 and connections;
	// it is deleted by a later sweep once it has none.
	TerminationDraining
)

// String returns "deleted" or "draining".
func (t Termination) String() string {
	switch t {
	case TerminationDeleted:
		return "deleted"
	case TerminationDraining:
		return "draining"
	}
	return fmt.Sprintf("Termination(%d)", int(t))
}

// DefaultSweepPeriod is how often [GracefulTerminator.Run] sweeps without
// [WithSweepPeriod], as kube-proxy does.
const DefaultSweepPeriod = time.Minute

// GracefulTerminator removes real servers without cutting their open
// connections: a real server being removed gets weight 0, so it receives no
// new connections, and is deleted once the kernel counts no active and no
// inactive connections for it. UDP and SCTP real servers are deleted at
// once (the kernel expires their flows on the next packet), as kube-proxy
// does.
//
// It keeps the list of draining real servers in memory only. After a
// restart a [Reconciler] finds the draining servers again, as real servers
// that are no longer wanted, and terminates them anew; a real server left
// at weight 0 that is wanted again gets its weight back (upstream
// kubernetes#92019, kubernetes#108319).
//
// It is safe for concurrent use.
type GracefulTerminator struct {
	iface       Interface
	clock       clock.WithTicker
	sweepPeriod time.Duration

	mu      sync.Mutex
	pending map[key]map[rsKey]Draining // by virtual server, so that a reconcile asks once per virtual server
}

// rsKey is a real server's identity within its virtual server.
type rsKey struct {
	addr [16]byte
	port uint16
}

func (rs RealServer) key() rsKey { return rsKey{rs.Address.As16(), rs.Port} }

// Draining is a real server that a [GracefulTerminator] waits to delete.
type Draining struct {
	// VirtualServer is the real server's virtual server.
	VirtualServer VirtualServer
	// RealServer is the real server as it was when its termination
	// started: weight 0, with the connection counts it had then.
	RealServer RealServer
	// Since is when its termination started.
	Since time.Time
}

// WithSweepPeriod sets how often [GracefulTerminator.Run] sweeps; zero or
// less means [DefaultSweepPeriod]. Read by [NewGracefulTerminator], and by
// [NewReconciler] for the terminator it makes.
func WithSweepPeriod(d time.Duration) Option {
	return func(o *options) { o.sweepPeriod = d }
}

// NewGracefulTerminator returns a terminator of iface's real servers with
// nothing draining. It reads [WithClock] and [WithSweepPeriod].
func NewGracefulTerminator(iface Interface, opts ...Option) *GracefulTerminator {
	o := newOptions(opts)
	return &GracefulTerminator{iface: iface, clock: o.clock, sweepPeriod: o.sweepPeriod, pending: map[key]map[rsKey]Draining{}}
}

// immediate reports whether real servers of vs are deleted without
// draining.
func immediate(vs VirtualServer) bool {
	return vs.Protocol == v1.ProtocolUDP || vs.Protocol == v1.ProtocolSCTP
}

// Terminate starts the termination of rs, a real server of vs as the
// kernel listed it (its weight and connection counts are used, so list it
// just before). A UDP or SCTP real server, or one with no connections, is
// deleted now; any other is set to weight 0 (unless it has that already)
// and left draining until a [GracefulTerminator.Sweep] finds it idle.
// Terminating a server that is already draining does nothing. A real
// server that no longer exists is not an error.
func (g *GracefulTerminator) Terminate(ctx context.Context, vs VirtualServer, rs RealServer) (Termination, error) {
	if g.InProgress(vs, rs) {
		return TerminationDraining, nil
	}
	if immediate(vs) || rs.ActiveConn+rs.InactiveConn == 0 {
		if err := g.iface.DeleteRealServer(ctx, vs, rs); err != nil && !IsNotFound(err) {
			return 0, err
		}
		return TerminationDeleted, nil
	}
	if rs.Weight != 0 {
		drained := rs
		drained.Weight = 0
		if err := g.iface.UpdateRealServer(ctx, vs, drained); err != nil {
			if IsNotFound(err) {
				return TerminationDeleted, nil
			}
			return 0, err
		}
	}
	rs.Weight = 0
	g.mu.Lock()
	m := g.pending[vs.key()]
	if m == nil {
		m = map[rsKey]Draining{}
		g.pending[vs.key()] = m
	}
	m[rs.key()] = Draining{VirtualServer: vs, RealServer: rs, Since: g.clock.Now()}
	g.mu.Unlock()
	klog.FromContext(ctx).V(4).Info("Real server draining", "virtualServer", vs, "realServer", rs,
		"activeConnections", rs.ActiveConn, "inactiveConnections", rs.InactiveConn)
	return TerminationDraining, nil
}

// InProgress reports whether rs of vs is draining.
func (g *GracefulTerminator) InProgress(vs VirtualServer, rs RealServer) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.pending[vs.key()][rs.key()]
	return ok
}

// Cancel stops the termination of rs of vs, which is wanted again, and
// reports whether it was draining. It writes nothing: the caller restores
// the weight.
func (g *GracefulTerminator) Cancel(vs VirtualServer, rs RealServer) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.drop(vs.key(), rs.key(), time.Time{})
}

// drop ends the termination of the real server r of the virtual server k,
// if it started at since (any time if since is zero), and reports whether
// it did. The caller holds g.mu.
func (g *GracefulTerminator) drop(k key, r rsKey, since time.Time) bool {
	d, ok := g.pending[k][r]
	if !ok || (!since.IsZero() && !d.Since.Equal(since)) {
		return false
	}
	delete(g.pending[k], r)
	if len(g.pending[k]) == 0 {
		delete(g.pending, k)
	}
	return true
}

// Forget drops every draining real server of vs, for a virtual server that
// is being deleted with them.
func (g *GracefulTerminator) Forget(vs VirtualServer) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.pending, vs.key())
}

// draining reports whether any real server of the virtual server k is
// draining.
func (g *GracefulTerminator) draining(k key) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.pending[k]) > 0
}

// Draining returns the real servers waiting to be deleted, ordered by
// virtual server and real server.
func (g *GracefulTerminator) Draining() []Draining {
	g.mu.Lock()
	var list []Draining
	for _, m := range g.pending {
		for _, d := range m {
			list = append(list, d)
		}
	}
	g.mu.Unlock()
	slices.SortFunc(list, func(a, b Draining) int {
		return cmp.Or(compareVS(a.VirtualServer, b.VirtualServer),
			a.RealServer.Address.Compare(b.RealServer.Address), cmp.Compare(a.RealServer.Port, b.RealServer.Port))
	})
	return list
}

func compareVS(a, b VirtualServer) int {
	return cmp.Or(a.Address.Compare(b.Address), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Port, b.Port))
}

// Sweep lists the real servers of every virtual server with draining ones
// and deletes those with no active and no inactive connections. A draining
// server that has disappeared (deleted by someone else, or with its virtual
// server) is dropped from the list. It returns the number deleted; errors
// for one virtual server do not stop the others and are joined.
func (g *GracefulTerminator) Sweep(ctx context.Context) (int, error) {
	byVS := map[key][]Draining{}
	for _, d := range g.Draining() {
		byVS[d.VirtualServer.key()] = append(byVS[d.VirtualServer.key()], d)
	}
	var errs []error
	deleted := 0
	for _, list := range byVS {
		vs := list[0].VirtualServer
		current, err := g.iface.ListRealServers(ctx, vs)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		now := make(map[rsKey]RealServer, len(current))
		for _, rs := range current {
			now[rs.key()] = rs
		}
		for _, d := range list {
			rs, ok := now[d.RealServer.key()]
			switch {
			case !ok:
			case rs.ActiveConn+rs.InactiveConn > 0:
				continue
			default:
				if err := g.iface.DeleteRealServer(ctx, vs, rs); err != nil && !IsNotFound(err) {
					errs = append(errs, err)
					continue
				}
				deleted++
				klog.FromContext(ctx).V(4).Info("Drained real server deleted", "virtualServer", vs, "realServer", rs)
			}
			g.mu.Lock()
			// Only if it is still the same termination: a concurrent
			// Cancel and Terminate must win.
			g.drop(vs.key(), d.RealServer.key(), d.Since)
			g.mu.Unlock()
		}
	}
	return deleted, errors.Join(errs...)
}

// Run sweeps every [WithSweepPeriod] (by default [DefaultSweepPeriod])
// until ctx is done, logging errors.
func (g *GracefulTerminator) Run(ctx context.Context) {
	interval := g.sweepPeriod
	if interval <= 0 {
		interval = DefaultSweepPeriod
	}
	t := g.clock.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			if _, err := g.Sweep(ctx); err != nil {
				klog.FromContext(ctx).Error(err, "Sweeping draining IPVS real servers")
			}
		}
	}
}
