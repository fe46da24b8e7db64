// Package nftablesbackend is kube-proxy's nftables mode as a
// proxy.Backend: one Backend per IP family, in a BackendGroup of its
// own, renders the family's table with the nftables service rule writer
// (full syncs, and partial ones holding only what changed) and runs each
// transaction with nft -f through knftables; nft applies it whole or not
// at all, and after a failure the next sync is full. With
// WithNetlinkElementSyncs, a partial sync that changes only elements of
// the big maps and sets (endpoints coming and going: the common case) is
// sent as one nf_tables netlink batch instead, just as atomic, without the
// exec of nft; with WithSplitFirstLoad, a load into a missing table sends
// its elements that way after nft has made the rest. Made without a
// knftables.Interface it is a dry run that prints the transactions as
// nft -f takes them, and sends nothing through netlink.
//
// Between syncs its Run asks the kernel, over netlink, whether the table
// still exists, and asks for a full resync when another program deleted
// it (nft flush ruleset, nft delete table); that full sync repairs it in
// one transaction, whatever the writer remembers of the lost table. The
// check is one request for that table alone, where "nft list tables" and
// knftables' List of the chains read the whole ruleset first
// (BenchmarkTableCheck, BENCHMARKS.md: nft's cost grows with the table,
// the request's does not).
//
// The writer's periodic full resync (hourly, WithFullSyncPeriod) reads the
// kernel instead of rewriting the table: when nothing was committed in the
// namespace since the Backend's own last transaction it is skipped (one
// read of the generation); when others committed, a watcher of nf_tables' monitor
// group (nftables.WatchKernel) says what their batches changed in the
// table, and only that is read and, where it drifted, repaired in a
// partial sync, in a time that does not grow with the table. Full syncs run with the watcher out of the group
// (KernelWatcher.Quiet), so that the kernel builds no notification per
// object; what others commit meanwhile, or after lost notifications, makes
// the next resync compare the elements and rule counts it wrote by key, as
// it does when the group cannot be joined (nftables.NewKernelState).
// TestKernelPeriodicResync.
//
// Drift does not wait for that hourly resync. Run asks the writer whether
// others changed the table (nftables.Writer.Drifted) whenever the watcher
// sees a commit to it, and every drift check period (WithDriftCheckPeriod,
// which lists what is found how fast); when they may have, it calls lost,
// and the sync that follows compares and repairs in a partial sync
// instead of rewriting the table. The repair converges the table to
// exactly the writer's: what others deleted or flushed comes back, and
// what they added (elements, chains, rules in the writer's chains, sets,
// maps) goes. The Backend's own commits are told from others' by the
// nf_tables generation, so a repair brings no further one.
// TestKernelDriftRepaired.
//
// What the mode needs of the node beyond the table (conntrack tuning,
// removing another mode's rules) is the caller's: see examples/proxier's
// backends.go.
//
//	nft, err := knftables.New(knftables.IPv4Family, nftables.DefaultTableName)
//	b, err := nftablesbackend.New(ctx, nftables.WriterConfig{IPFamily: v1.IPv4Protocol, NodeName: node.Name, NodeIPs: node.IPs[v1.IPv4Protocol]}, nft,
//		nftablesbackend.WithMetrics(metrics))
//	groups := []proxier.BackendGroup{{Backend: b, Families: []v1.IPFamily{v1.IPv4Protocol}}}
//
// Importing it compiles 750 packages (go list -deps): the nftables block,
// knftables, and the google/nftables netlink library for the table check.
package nftablesbackend
