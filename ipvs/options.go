package ipvs

import "context"

// Option configures [New].
type Option func(*options)

type options struct {
	netnsPath  string
	checker    PrerequisiteChecker
	noChecker  bool
	schedulers []string
}

// WithNetNSPath makes [New] manage the IPVS table of the network namespace
// bind-mounted at path (such as /run/netns/NAME or /proc/PID/ns/net)
// instead of the caller's own namespace.
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
// generic netlink has no IPVS family.
func WithPrerequisites(c PrerequisiteChecker) Option {
	return func(o *options) { o.checker, o.noChecker = c, c == nil }
}

// WithSchedulers names the schedulers the prerequisite check requires;
// the default is [DefaultScheduler] alone.
func WithSchedulers(names ...string) Option {
	return func(o *options) { o.schedulers = names }
}
