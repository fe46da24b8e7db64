package ipset

// Option configures [New].
type Option func(*options)

type options struct {
	netnsPath string
}

// WithNetNSPath makes [New] manage the ipsets of the network namespace
// bind-mounted at path (such as /run/netns/NAME, as `ip netns add` makes
// them, or /proc/PID/ns/net) instead of the caller's own namespace.
func WithNetNSPath(path string) Option {
	return func(o *options) { o.netnsPath = path }
}
