// Package nftmeasure builds large nftables service rulesets and the small
// changes a partial sync makes to them, as knftables transactions and as
// google/nftables netlink batches, so that how the
// nftables block's transactions reach the kernel (exec of nft through
// knftables, or netlink directly) is decided by measurement. It is internal
// on purpose: nothing here is the nftables block's API, and the ruleset is
// the skeleton of a service proxy's (dispatch, per-service load balancing,
// DNAT), not a complete one: no node ports, external IPs, IPv6, UDP or
// SCTP; only the DataMap layout has masquerading, hairpin, ClientIP
// affinity, drop or reject without endpoints and source ranges.
//
// Four layouts are generated. [KubeProxyLike] puts an anonymous
// `numgen random mod N vmap { ... }` in every service chain, as kube-proxy's
// nftables mode does, so the number of sets grows with the services.
// [SharedMap] has one named verdict map of all endpoints, and each service
// chain addresses its own slice of it with `numgen random mod N offset O`,
// so the table holds two maps however many services it serves; it measures
// quadratic in the kernel (every service chain's lookup makes the commit's
// loop check walk the whole map). [NumgenCascade] has no per-service sets
// either: a service chain is a cascade of `numgen random mod K 0 goto`
// rules. [DataMap], the layout the measurements recommend, keeps both the
// kernel's set code and its jump validation out of an endpoint change: one
// data map of all endpoints, looked up by one shared chain per endpoint
// count, so that a one-endpoint change is element operations only.
// The namespace's nf_tables generation (read with the nftables block's
// KernelState, which grew from this package) and [DetectDrift] are how a
// periodic resync finds, without listing the table, whether anything
// changed and what.
//
// The tests are the measurement; see BENCHMARKS.md for the figures and the
// commands that reproduce them.
package nftmeasure
