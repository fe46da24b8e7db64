// Package nftables writes the service rules of kube-proxy's nftables mode
// as knftables transactions: a table per IP family, verdict maps keyed by
// service address, protocol and port, and chains per service port and
// endpoint. It renders; the caller runs the transaction with a
// knftables.Interface (nft -f through knftables) and reports the outcome,
// as with the iptables package's Writer. It does not watch the API, pick
// endpoints' health, or clean conntrack: the changetracker and conntrack
// packages do.
//
// # Layout
//
// Each family's table (default "kube-proxy") holds:
//
//	hook        priority     base chain               jumps to (new connections: ct state new)
//	prerouting  dstnat-10    filter-prerouting   ──▶  firewall-check ─▶ vmap @firewall-ips ─▶ firewall-<svc>: drop sources outside the ranges
//	output      dstnat-10    filter-output       ──▶  service-endpoints-check, firewall-check
//	input       dstnat-10    filter-input        ──▶  nodeport-endpoints-check ─▶ vmap @no-endpoint-nodeports
//	                                                  service-endpoints-check  ─▶ vmap @no-endpoint-services
//	                                                                              (drop: no local endpoint; goto reject-chain: none at all)
//	forward     dstnat-10    filter-forward      ──▶  service-endpoints-check, cluster-ips-check
//	output      dstnat+10    filter-output-post-dnat ▶ cluster-ips-check: reject @cluster-ips (a port the service lacks),
//	                                                  drop the service CIDRs (an address no service has)
//	prerouting  dstnat       nat-prerouting  ─┐
//	output      dstnat       nat-output      ─┴──▶  services:
//	                                                  daddr . proto . dport vmap @service-ips ──▶ service-<svc> | local-<svc> | external-<svc>
//	                                                  fib daddr local [daddr @nodeport-ips] proto . dport vmap @service-nodeports ─▶ external-<svc>
//	postrouting srcnat       nat-postrouting ────▶  masquerading: masquerade packets with the mark (mark-for-masquerade sets it)
//
//	external-<svc>  masquerade (Cluster policy), or short-circuit pods and the node to service-<svc> (Local policy); goto the policy chain
//	service-<svc>   masquerade traffic from outside the cluster CIDR; affinity: saddr @affinity-<ep> goto endpoint-<ep>;
//	local-<svc>     numgen random mod N vmap { 0 : goto endpoint-<ep0>, ... }
//	endpoint-<ep>   masquerade hairpin traffic; update @affinity-<ep> { saddr }; dnat to ip:port
//
// The names of per-service chains and sets are kube-proxy's, a hash and
// "ns/name/proto/port" (and "__ip/port" for an endpoint), so a reader of
// either table recognises the other's.
//
// # Syncs
//
// A Writer remembers what it wrote. A partial sync holds only the chains,
// affinity sets and map and set elements of the services named in the
// change results: it never flushes a top-level chain, map or set, so its
// size and its cost, in the writer and in the kernel, grow with the change
// and not with the cluster (BenchmarkSyncPartial: one endpoint of ten
// going is 7 operations, 1.4 KB of nft text, at 1,000, 10,000 and 30,000
// services). Endpoint chains whose content cannot have changed are not
// rewritten. A full sync (the first, one after
// a failed transaction, RequestFullSync, node label changes,
// FullSyncPeriod) flushes and refills everything the writer owns in one
// atomic transaction and deletes what nothing needs; the first full sync
// and the first after a failure list the table's chains and sets once, to
// find objects no memory holds.
//
// # What differs from kube-proxy, and why
//
//   - Partial syncs are O(change): kube-proxy walks every service and
//     re-adds every map element on each sync.
//   - Stale chains are deleted in the same transaction, after the elements
//     and rules that referred to them: kube-proxy defers them one sync for
//     kernels older than the fix that made those references
//     transactional (see deleteChain). Such kernels fail the transaction
//     instead.
//   - Node-port addresses are matched as "local address inside a prefix"
//     (nodeport-ips holds the prefixes), not as a list of the node's
//     addresses, so the writer needs no view of the interfaces and stays
//     right as addresses come and go.
//   - The table name is configurable, so a proxy can run beside
//     kube-proxy.
//   - Every name and comment that reaches the transaction is checked
//     (DNS labels only); a port that fails is skipped with a log.
//   - Element claims: when two services claim one address and port (an
//     external IP listed twice), the first claim holds the element and the
//     next takes over when it goes, instead of the last writer winning.
//
// How a service chain picks an endpoint (the numgen vmap) is written by
// one function, writeEndpointSelection, so that a layout that loads
// faster in the kernel can replace it alone.
//
// The transport is nft -f, through knftables; issue 15's measurements
// (BENCHMARKS.md, "nftables: exec vs netlink") favour netlink for partial
// syncs, which a translator of these transactions would add later.
//
// Tests use knftables.Fake; nftables/testing (package nftablestest) adds a
// packet tracer over the Fake's state and a check of a transaction against
// what the kernel refuses and the Fake lets through.
package nftables
