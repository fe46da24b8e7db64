// Package nftables writes the service rules of a kube-proxy-compatible
// nftables datapath as knftables transactions: a table per IP family in
// which services are map and set elements, not chains, so that both the
// transaction and the kernel's work grow with what changed. It renders;
// the caller runs the transaction with a knftables.Interface (nft -f
// through knftables) and reports the outcome, as with the iptables
// package's Writer. It does not watch the API, pick endpoints' health, or
// clean conntrack: the changetracker and conntrack packages do.
//
// # Layout ("data-map")
//
// Each family's table (default "kube-proxy") holds kube-proxy's base
// chains, hooks and priorities, and these objects, whose number does not
// grow with the services except as elements:
//
//	hook        priority   base chain                    jumps to (new connections: ct state new)
//	prerouting  dstnat-10  filter-prerouting-pre-dnat ─▶ firewall-check: daddr . proto . dport @firewall-ips and
//	output      dstnat-10  filter-output-pre-dnat     ─▶   daddr . proto . dport . saddr != @firewall-allow: drop
//	input       filter     filter-input               ─▶ nodeport-endpoints-check ─▶ vmap @no-endpoint-nodeports,
//	                                                   ─▶ service-endpoints-check  ─▶ vmap @no-endpoint-services
//	forward     filter     filter-forward             ─▶ service-endpoints-check, then cluster-ips-check
//	output      filter     filter-output              ─▶ service-endpoints-check, then cluster-ips-check
//
//	  no-endpoint-* verdicts: drop (no local endpoint), goto reject-chain (no endpoint at all)
//	  cluster-ips-check: reject @cluster-ips (a port the service lacks), drop the service CIDRs (an
//	    address no service has)
//
//	prerouting  dstnat     nat-prerouting  ─┐
//	output      dstnat     nat-output      ─┴──▶  services:
//	                                                daddr . proto . dport vmap @service-ips ──▶ lb-K | lb-external-K | <per-service>
//	                                                fib daddr local [daddr @nodeport-ips] proto . dport vmap @service-nodeports ──▶ lb-nodeport-K | <per-service>
//	postrouting srcnat     nat-postrouting ────▶  masquerading: ct status dnat saddr . daddr @hairpin-endpoints: mark;
//	                                                masquerade marked packets, clearing the mark
//
//	lb-K             (cluster-IP traffic)   saddr != <cluster CIDR> jump mark-for-masquerade (all with MasqueradeAll)
//	                                        dnat to daddr . proto . tcp dport . numgen random mod K map @endpoints  (and udp, sctp)
//	lb-external-K    (external IPs, LB IPs) jump mark-for-masquerade; the same DNAT
//	lb-nodeport-K    (node ports)           jump mark-for-masquerade; dnat to proto . tcp dport . numgen random mod K map @nodeport-endpoints
//
//	endpoints           map  daddr . proto . port . index : endpoint address . port
//	nodeport-endpoints  map  proto . node port . index    : endpoint address . port
//	hairpin-endpoints   set  ep . ep, for this node's endpoints
//	firewall-ips, firewall-allow  sets  VIP . proto . port (. source range, intervals)
//
// Only the firewall check sees the address the client chose (before
// DNAT); the other checks run after nat-output and nat-prerouting, so they
// match only a packet that no rule sent on to an endpoint. That is what
// lets the node's own connection to an external IP or load-balancer IP
// of a service with an external traffic policy of Local and no endpoint
// on this node through: nat-output short-circuits it to all endpoints, as
// from a pod, and the drop in no-endpoint-services, meant for clients
// outside the node, no longer matches it. Since the firewall runs first,
// a client outside a load balancer's source ranges is dropped even when
// the service has no endpoints, not rejected.
//
// A service port of K endpoints is, for its cluster IP, one service-ips
// element pointing at the shared chain lb-K and K endpoints elements at
// indexes 0..K-1; each external IP and load-balancer IP the same with
// lb-external-K; its node port a service-nodeports element and K
// nodeport-endpoints elements. The shared chains exist once per kind and
// endpoint count in use, so at most three rules (one per protocol: see
// below) per count look the endpoints map up.
//
// Two kinds of service keep kube-proxy's per-service shape, whose chains
// are named as kube-proxy names them (a hash and "ns/name/proto/port", and
// "__ip/port" for an endpoint): service-<svc> or local-<svc> picks an
// endpoint-<ep> chain with "numgen random mod N vmap", endpoint-<ep>
// masquerades hairpin traffic, records affinity and DNATs, and
// external-<svc> applies the external policy:
//
//   - ClientIP affinity: the endpoint a client used is recorded per
//     endpoint, in a set with a timeout, which a data map cannot express.
//   - An external traffic policy of Local on a service reachable from
//     outside: pods and the node reaching an external address go to all
//     endpoints, everyone else to this node's, and the node's traffic is
//     masqueraded, all under one key; that needs the per-service chain.
//
// Terminating fallback, topology and an internal traffic policy of Local
// are only which endpoints are listed, so they stay elements.
//
// # Syncs
//
// A Writer remembers what it wrote. A partial sync holds only the elements
// (and the per-service chains and affinity sets, for the two kinds above)
// of the services named in the change results: it never flushes a
// top-level map or set, nor a top-level chain. Replacing an endpoint rewrites one element
// per address the service has; removing one moves the last endpoint into
// its index and points the service's elements at the shared chain of one
// fewer (a ClusterIP service's endpoint of ten going is 5 element
// operations, 3 when it was the last; coming back, 3; as many and as
// small at any number of services: BenchmarkSyncPartial,
// TestWriterDataMapPartial). A shared chain is
// added by the first partial sync that needs its count and kept while
// unused; a full sync deletes the unused ones. A full sync (the first,
// one after a failed transaction, RequestFullSync, node label changes,
// a change of the service CIDRs, which decide which ports are refused,
// FullSyncPeriod unless the periodic resync below avoids it) rewrites every
// chain and rule the writer owns in one atomic transaction and deletes what
// nothing needs; the first full sync and the first after a failure list the
// table's chains and sets once, to find objects no memory holds. The
// elements of its maps and sets are not sent again when the kernel holds
// them unchanged: a full sync into a table the writer knows sends only the
// elements that differ (see Writer.RequestFullSync), and flushes and fills
// them only when the table is missing or their listing fails (and always
// for the interval sets firewall-allow and nodeport-ips, a few elements,
// whose listing nft prints in another form). A chain or set that a sync deletes is
// added first in the same transaction, so that one another program
// deleted (or the whole table, before RequestFullSync) does not make the
// kernel refuse the transaction.
//
// # Periodic resync
//
// A resync (WriterConfig.FullSyncPeriod) exists to repair what others
// changed in the table. Without WriterConfig.KernelState it rewrites the
// table. With it (nf_tables netlink, no nft), the writer finds out first,
// and rewrites only what drifted:
//
//  1. Generation. The kernel bumps a namespace-wide counter on every
//     committed batch of any table. The writer reads it before and after
//     each of its own transactions; when the counter moved by no more
//     than the writer's own batches since the table was last known to
//     match its memory, the resync is skipped. Another program's commit,
//     whenever it falls, leaves a gap that is never taken for the
//     writer's own.
//  2. Watcher. With a KernelWatcher (WatchKernel) as KernelState, the
//     writer also knows which chains and elements each other program's
//     batch changed in its table: a commit to another table costs no
//     check, and one to its table makes it read only what changed.
//  3. Drift check. When no watcher vouches for the table (another
//     program committed, to it or, without a watcher, to any table;
//     notifications were lost; a set or the table was added or deleted;
//     more keys changed than the watcher keeps; the generation could not
//     be read), the writer compares the table with its memory: the
//     number of rules in each chain it wrote, and each element it wrote,
//     looked up by key (a dump of a set costs the kernel quadratic time).
//     What differs is repaired in the partial sync's transaction: a
//     missing element added, one with another value deleted and added, a
//     drifted base, top-level or shared chain added, flushed and filled
//     again. SyncResult.Resync and Drifted say what happened.
//  4. Rewrite. When the table is missing (it is loaded again, split with
//     SplitFirstLoad), a per-service chain drifted (those of affinity and
//     Local-external services, which only a full render writes), or the
//     check failed, the resync is a full sync as without KernelState.
//
// Choosing: use a KernelWatcher where the process may join nf_tables'
// monitor group, and run full syncs inside KernelWatcher.Quiet, since a
// listener makes the kernel build a notification for every object of
// every batch; NewKernelState where it may not, whose whole check grows
// with the elements; neither, and every resync is a rewrite.
//
// The check does not see an element added by hand that the writer never
// wrote, the interval sets' elements (firewall-allow, nodeport-ips), or a
// chain added by hand that nothing jumps to, nor, without a watcher, a
// rule changed in place (the count is the same; a watcher names its
// chain, which is rewritten); RequestFullSync still rewrites the table
// whole, for callers that suspect more. The whole check's cost grows with
// the elements; with a watcher's scope it and the repair are O(what
// drifted).
//
// # What differs from kube-proxy, and why
//
//   - Services are elements: no service-/endpoint- chains for services
//     without affinity or a Local external policy, so "nft list" shows
//     such a service as elements and there are no per-service chain
//     counters. Packets see the same decisions. kube-proxy's anonymous
//     "numgen vmap" per service makes the kernel's load of a large
//     table quadratic in the services (each anonymous set is a set the
//     kernel finds by a linear search); this layout's load is linear.
//   - The hairpin masquerade looks up "saddr . daddr" of a DNATed
//     connection in a set of this node's endpoint addresses ("ep . ep");
//     kube-proxy's hairpin-connections set holds "ep . ep . proto . port"
//     per local endpoint. For a connection these rules DNATed the two
//     agree (its destination is an endpoint's address and port); a
//     connection that another program's rules DNATed from a local
//     endpoint to itself, on a port no service uses, is masqueraded here
//     and not by kube-proxy.
//   - Masquerading is marked in the shared and per-service chains
//     (through a mark-for-masquerade chain) for the packets they DNAT;
//     kube-proxy marks inline, and for cluster-IP traffic from outside
//     the cluster CIDR (or all of it, with MasqueradeAll) in "services",
//     before the lookup. The same connections leave masqueraded: what
//     kube-proxy marks besides is not DNATed and is dropped or rejected.
//   - Removing an endpoint moves the last one into its index: established
//     connections keep their conntrack entries and new ones stay uniform
//     over the endpoints, with at most two elements rewritten.
//   - The endpoints maps are declared "typeof … tcp dport", and each
//     shared chain has one lookup rule per protocol (tcp, udp, sctp): nft
//     1.0.6 refuses a rule added later against a map whose typeof holds
//     "th dport" ("conflicting protocols specified"), which any partial
//     sync that adds a shared chain would do.
//   - Source ranges are elements of two sets (firewall-allow is a
//     concatenated interval set) instead of a chain and an anonymous set
//     per load balancer; a range inside another of the same service is
//     left out, since the kernel refuses overlapping intervals. A load
//     balancer's own VIP is allowed as a source when a range holds any of
//     WriterConfig.NodeIPs; kube-proxy checks its one node IP of the
//     family.
//   - Partial syncs are O(change): kube-proxy walks every service on each
//     sync, though it sends only the elements that changed.
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
//   - The first sync deletes the base chains of the earlier layout
//     (filter-prerouting, filter-output-post-dnat) that a table written
//     by an earlier version or by an older kube-proxy holds; kube-proxy
//     leaves them, where they repeat the firewall and cluster-IP checks.
//   - Localhost node ports: kube-proxy's alpha KubeProxyNFTablesLocalhostNodePorts
//     gate (off by default) rejects, with a counter, or proxies in user
//     space connections to a loopback address at a node port. This package
//     has neither: as kube-proxy with the gate off, node ports are not
//     served on loopback addresses, and such a connection reaches whatever
//     listens on the port.
//
// Apart from these, the rules make kube-proxy's decisions, as far as its
// own nftables test cases and this package's tests (with the tracer and
// with real packets) go, and in its order: the firewall before DNAT, the
// no-endpoints and cluster-IP checks after it (see the layout above).
//
// # Transport
//
// Transactions go through knftables, one "nft -f" each, with two
// exceptions that send elements through nf_tables netlink instead (the
// messages nft and github.com/google/nftables would send, encoded in one
// buffer), without nft's exec, parser and exit. With this layout nft's cache stays small (a few dozen chains
// whatever the services), so those are what a partial sync costs
// through nft, and they are most of it.
//
// WriterConfig.NetlinkElementSyncs sends a partial sync whose every change
// is an element deletion or addition of the big maps and sets (endpoints,
// nodeport-endpoints, service-ips, service-nodeports, cluster-ips,
// hairpin-endpoints, firewall-ips) as one netlink batch (SyncResult.Batch,
// ApplyElementBatch): deletions by key, then additions, in the
// transaction's order. That is the common partial sync: endpoints coming
// and going, and services added or removed whose shared chains exist. A
// batch is one nf_tables transaction, committed whole or refused whole
// like nft's, so nothing else changes: the outcome goes to Applied, a
// refused batch makes the next sync full, and a batch counts as one commit
// of the writer's own for the periodic resync. A partial sync that
// touches anything else (a chain or rule, an affinity set, an element with
// a comment, which nft encodes in a form of its own, or an interval set,
// whose ranges nft splits) stays one nft transaction, never split in two,
// and so does every full sync. ApplyElementBatch closes its socket in
// the background: the kernel makes the release of a netfilter socket wait
// for the freeing of what earlier batches deleted, an RCU grace period
// that would otherwise be added to the batch; the batch is committed once
// its acknowledgements are read.
//
// A full load through nft is dominated by nft parsing the elements.
// WriterConfig.SplitFirstLoad splits a full sync into
// a missing table: the skeleton (about a hundred objects) through nft, and
// the elements of the big maps and sets through netlink with
// ApplyElements. Only a load into a missing
// table is split, because the two steps are not one transaction: a full
// resync of an existing table changes elements in place, and its
// transaction must hold the chains and the elements together.
//
// Set both when the caller sends SyncResult.Elements and Batch to the
// kernel its transactions reach (ApplyElements and ApplyElementBatch talk
// to the network namespace of the calling thread); leave them off over a
// knftables.Fake and in a dry run, where everything should read as nft -f
// takes it.
//
// The netlink encoding is nft's (fields in whole 32-bit registers,
// host-order numgen index), for both families and TCP, UDP and SCTP:
// TestApplyElementBatchKernel, TestWriterSplitFirstLoadKernel and
// TestWriterNetlinkElementSyncsKernel check that it leaves the table nft -f
// leaves, and that a refused batch changes nothing.
//
// # Bounds
//
// A hung nft or a kernel that never answers would stop every later sync.
// BoundedInterface kills an nft command that runs longer than its bound,
// and Netlink gives each netlink request (a batch, or a read of the
// KernelState) a deadline on its socket; both fail with an error for
// which IsCommandTimeout is true, after DefaultCommandTimeout unless told
// otherwise (the Mode's WithCommandTimeout sets both). A
// transaction or batch that timed out may have been committed or not:
// reported to Applied like any failure, it makes the next sync full. A
// KernelState read that timed out is a failed read: the writer compares
// the table at its next periodic resync, or rewrites it when a resync's
// comparison fails. What no bound can end is an nft stuck in the kernel,
// which no signal reaches: its call returns when it exits.
//
// Tests use knftables.Fake; nftables/nftablestest adds a
// packet tracer over the Fake's state, which follows the data-map lookups,
// and a check of a transaction against what the kernel refuses and the
// Fake lets through.
//
// The measurements behind these choices (layout, transport, resync) are
// in the repository's BENCHMARKS.md and docs/benchmarks-history.md.
//
// # nftables mode
//
// [Mode] is kube-proxy's nftables mode as a proxy.Backend: one Mode per IP
// family, in a BackendGroup of its own, renders the family's table with
// the [Writer] (full syncs, and partial ones holding only what changed)
// and runs each transaction with nft -f through knftables; nft applies it
// whole or not at all, and after a failure the next sync is full. Over a
// real knftables Interface the Mode sends a partial sync that changes only
// elements of the big maps and sets (endpoints coming and going: the
// common case) as one nf_tables netlink batch instead, just as atomic, and
// a load into a missing table sends its elements that way after nft has
// made the rest; over a knftables.Fake, and in a dry run (a nil
// Interface, which prints the transactions as nft -f takes them), every
// sync is one transaction and nothing goes through netlink. The netlink
// requests, like nft, reach the network namespace of the thread that
// syncs.
//
// Between syncs its Run asks the kernel, over netlink, whether the table
// still exists, and calls lost when another program deleted it (nft flush
// ruleset, nft delete table); the full sync that follows repairs it in one
// transaction, whatever the writer remembers of the lost table. Run also
// asks the writer whether others changed the table ([Writer.Drifted])
// whenever a watcher of nf_tables' commits sees one, and every drift check
// period ([WithDriftCheckPeriod]); when they may have, the sync that
// follows compares and repairs in a partial sync instead of rewriting the
// table, and the table converges to exactly the writer's. The periodic
// full resync (WriterConfig.FullSyncPeriod; zero means an hour, as
// kube-proxy's) reads the kernel's generation first and is skipped when
// nothing was committed since the Mode's own last transaction.
//
//	nft, err := knftables.New(knftables.IPv4Family, nftables.DefaultTableName)
//	m, err := nftables.NewMode(ctx, nftables.WriterConfig{Family: v1.IPv4Protocol, Node: node}, nft,
//		nftables.WithMetrics(metrics))
package nftables
