// Package ipvsmode is kube-proxy's IPVS mode. A [Writer] per IP family
// renders the tracker's maps (a proxy.FamilyInput) into the virtual
// servers, the ipsets (package ipset) and the few iptables rules (package
// iptables) that kube-proxy's IPVS mode programs, with its names; an
// [Applier] applies the results of a node's families in the order the
// kernel needs, through the reconcilers of packages ipvs and ipset; and
// [Cleanup] removes all of it. [Names] names the chains and ipsets from a
// prefix (WriterConfig.ChainPrefix), kube-proxy's KUBE by default
// ([DefaultNames]), so that two proxies' chains and sets stay apart; its
// FindLeftovers tells which modes' chains a node holds.
//
// [Mode] is IPVS mode as a proxy.Backend: one Mode for all of the node's
// IP families, in one BackendGroup, since the kernel keeps the virtual
// servers and ipsets of both families in one table. Every sync is full
// (one that changes nothing writes nothing), and reads the addresses of
// the host's interfaces first, as kube-proxy's IPVS mode does. Between
// syncs its Run deletes the real servers it left draining once their
// connections are gone. Made without [Handles] it is a dry run that
// prints what it would apply. [OpenHandles] opens the kernel side (the
// IPVS table, the kube-ipvs0 dummy interface, the ipsets), [TuneKernel]
// sets IPVS mode's sysctls and [Tune] what kube-proxy's ipvs section asks
// for on top (strict ARP, the connection timeouts); [WithExcludeCIDRs]
// leaves other programs' virtual servers alone. Checking that the kernel
// can run IPVS (kernel.CanUseIPVS) and removing the other modes' state
// are package kubeproxy's, or the caller's.
package ipvsmode
