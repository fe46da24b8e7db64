package conntrack

// Option configures [New].
type Option func(*options)

type options struct {
	netnsPath string
}

// WithNetNSPath makes the Interface that [New] returns work on the
// conntrack table of the network namespace bind-mounted at path (such as
// /run/netns/NAME, as `ip netns add` makes them) or of /proc/PID/ns/net:
// conntrack entries are per namespace and only visible through a netlink
// socket in it. The namespace is opened again at each call, so a path that
// does not exist makes each call fail with an error naming it, and nothing
// stays open between calls. "" (the default) means the calling thread's
// namespace at the time of each call. Read by [New].
func WithNetNSPath(path string) Option {
	return func(o *options) { o.netnsPath = path }
}
