package ipvs

import (
	"context"
	"net/netip"
	"time"

	"k8s.io/utils/clock"
)

// Option configures [New], [NewReconciler], [NewGracefulTerminator] and
// [NewDummyBinder]: one type, so that a namespace or a clock is given the
// same way to each. Each option says which constructors read it; the
// others ignore it.
type Option func(*options)

type options struct {
	// New, NewDummyBinder
	netnsPath string
	// New
	checker    PrerequisiteChecker
	noChecker  bool
	schedulers []string
	// NewReconciler
	device         string
	exclude        []netip.Prefix
	term           *GracefulTerminator
	fullSyncPeriod time.Duration
	// NewReconciler, NewGracefulTerminator
	clock       clock.WithTicker
	sweepPeriod time.Duration
}

func newOptions(opts []Option) options {
	o := options{device: DummyDevice, clock: clock.RealClock{}}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// WithNetNSPath makes [New] manage the IPVS table, and [NewDummyBinder]
// the interfaces, of the network namespace bind-mounted at path (such as
// /run/netns/NAME or /proc/PID/ns/net) instead of the caller's own
// namespace. "" (the default) means the caller's. Read by New and
// NewDummyBinder.
func WithNetNSPath(path string) Option {
	return func(o *options) { o.netnsPath = path }
}

// PrerequisiteChecker checks that the node's kernel can run IPVS mode with
// the given schedulers. *kernel.Kernel from package
// github.com/proxykit/proxykit/kernel implements it.
type PrerequisiteChecker interface {
	// CanUseIPVS returns nil if the kernel can run IPVS with the given
	// schedulers (none means the default, rr), and otherwise an error
	// saying what is missing.
	CanUseIPVS(ctx context.Context, schedulers ...string) error
}

// WithPrerequisites makes [New] check the kernel with c instead of
// kernel.New(). A nil c skips that check; New still refuses a kernel whose
// generic netlink has no IPVS family. Read by New only.
func WithPrerequisites(c PrerequisiteChecker) Option {
	return func(o *options) { o.checker, o.noChecker = c, c == nil }
}

// WithSchedulers names the schedulers the prerequisite check requires;
// the default is [DefaultScheduler] alone. Read by [New] only.
func WithSchedulers(names ...string) Option {
	return func(o *options) { o.schedulers = names }
}

// WithClock sets the clock the package reads: [NewReconciler] times
// [WithFullSyncPeriod] with it, and [NewGracefulTerminator] times
// [GracefulTerminator.Run]'s sweeps and the Since of draining servers. The
// default is the real clock. Read by NewReconciler, which hands it to the
// terminator it makes (not to one given by [WithGracefulTerminator]), and
// by NewGracefulTerminator.
func WithClock(c clock.WithTicker) Option {
	return func(o *options) { o.clock = c }
}
