// Package ebpf is a socket-level service load balancer: BPF programs on a
// cgroup's connect, sendmsg, recvmsg and getpeername hooks that send a
// socket connecting to a Service address straight to one of the Service's
// endpoints, so that its packets carry the endpoint's address from the
// start and need no NAT, no conntrack entry for NAT and no rule walk.
package ebpf
