// Package ebpf is a socket-level service load balancer: BPF programs on a
// cgroup's connect, sendmsg, recvmsg and getpeername hooks that send a
// socket connecting to a Service address straight to one of the Service's
// endpoints, so that its packets carry the endpoint's address from the
// start and need no NAT, no conntrack entry for NAT and no rule walk.
//
// The package has three parts, as the other blocks do:
//   - Datapath (Open, Cleanup, FindLeftovers): one family's programs,
//     loaded with github.com/cilium/ebpf from objects compiled by bpf2go
//     and committed (bpf/sock.c, bpf/lb.h), attached to a cgroup v2
//     directory through links pinned on a bpffs beside the maps, so that
//     they outlive the process and a restarted proxy takes them over.
//   - Writer: turns the change trackers' maps of one family
//     (proxy.FamilyInput) into elements of the Datapath's maps, writing
//     only what changed; Drift compares the kernel's maps with what was
//     written, and the next full sync repairs any difference.
//   - Maps: what the Writer writes to, the Datapath or the in-memory
//     ebpftest.Fake, whose tracer says where a connection would go.
//   - Mode: the Writer as a proxy.Backend of one family, with metrics
//     and a periodic Drift check that makes the next sync full. It
//     serves local sockets only: compose it with a packet-level Backend
//     of the same family (nftables mode) in a BackendGroup of its own.
//
// What it needs from the kernel: the BPF syscall, cgroup v2, bpf_link
// for cgroups (5.7), bpf_get_netns_cookie on these hooks (5.7),
// getpeername hooks (5.8) and bpf_set_retval (5.18); CAP_BPF and
// CAP_NET_ADMIN, or root.
//
// What it does not do: it serves only sockets of processes in the cgroup
// it is attached to, so traffic that arrives from outside the node
// (node ports, external IPs and load-balancer VIPs reached from another
// host) needs a packet-level backend beside it, such as the nftables
// mode; connections it translates never carry a Service address, so the
// two never act on one packet. An IPv6 socket connecting or sending to an
// IPv4-mapped address (::ffff:10.96.0.10, as dual-stack sockets do) is
// translated only while the IPv6 programs are attached beside the IPv4
// maps (open both families). Load-balancer VIPs with
// loadBalancerSourceRanges are left to the packet-level backend.
// ClientIP affinity is per network namespace. A Service with endpoints
// nowhere reachable refuses connect and sendmsg with ECONNREFUSED, also
// where kube-proxy drops (a Local policy without a local endpoint), so
// that the caller learns at once instead of after its connect timeout.
// SCTP sockets are never translated: the kernel runs the cgroup connect
// hooks from TCP's and UDP's connect only, and the sendmsg hooks from
// UDP's sendmsg only, so an SCTP association goes to the Service address
// it was set up with, which the packet-level backend beside serves (the
// Writer still writes SCTP frontends, for a reader of the maps such as a
// packet-level program).
//
// The smallest use, for one family:
//
//	dp, err := ebpf.Open(ebpf.DatapathConfig{Family: v1.IPv4Protocol, CgroupPath: "/sys/fs/cgroup"})
//	...
//	w, err := ebpf.NewWriter(dp, ebpf.WriterConfig{Family: v1.IPv4Protocol, Node: node})
//	...
//	res, err := w.Sync(ctx, in) // at every sync of the proxy
package ebpf
