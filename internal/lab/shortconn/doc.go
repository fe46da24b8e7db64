// Package shortconn measures short connections to a Service in each mode
// that proxies them, side by side: connect, one request, one response,
// close, one connection at a time, to the Service that sorts last among
// N, in network namespaces the test makes and removes. The modes are
// iptables mode's writer (iptables-legacy), nftables mode's writer, and
// the ebpf socket load balancer attached to the client's cgroup beside
// nftables mode's rules on the node, as --mode ebpf runs it.
//
// Every mode has its own network: a client namespace on a link of a node
// namespace that holds the mode's rules and routes to a pod namespace on
// its bridge. The client is the test binary re-executed in the client
// namespace and in a cgroup of its own, made in a private cgroup2 mount
// (the ebpf modes attach their programs there), so every mode runs the
// same client loop from the same place; only where the Service address
// becomes an endpoint's differs: at the client's connect in the ebpf
// modes, in the node's nat rules (and conntrack) in the others.
//
// The package has only tests: TestShortConnReach (10 Services, runs with
// the kernel tests) checks each mode's premise with a few connections
// through the benchmark's own client and server, and
// BenchmarkShortConnections measures, reporting connections a second and
// the p50 and p99 latency of a connection:
//
//	PROXYKIT_REQUIRE_KERNEL=1 go test ./internal/lab/shortconn -run '^$' -bench ShortConnections -benchtime 20000x -timeout 30m
//
// PROXYKIT_SHORTCONN_MODES (comma-separated, of iptables, nftables, ebpf,
// and the diagnostic ones iptables-nft and ebpf-alone) chooses the modes;
// PROXYKIT_SHORTCONN_ROUNDS repeats them, alternating, in a rotating
// order.
package shortconn
