// Package ipvsbackend is kube-proxy's IPVS mode as a proxy.Backend: one
// Mode for all of the node's IP families, in one BackendGroup, since
// the kernel keeps the virtual servers and ipsets of both families in one
// table. A translator per family renders the virtual servers, the ipsets
// and the few iptables rules IPVS mode needs, and one ipvs.Applier
// reconciles the kernel with all of them at every sync (every sync is
// full; one that changes nothing writes nothing). Between syncs its Run
// deletes the real servers it left draining once their connections are
// gone. Made without a Handles it is a dry run that prints what it would
// apply.
//
// OpenHandles opens the kernel side (the IPVS table, the kube-ipvs0 dummy
// interface, the ipsets) and TuneKernel sets IPVS mode's sysctls; checking
// that the kernel can run IPVS (kernel.CanUseIPVS) and removing iptables
// mode's rules are the caller's: see examples/proxier's backends.go.
//
// Importing it compiles 745 packages (go list -deps), the netlink
// libraries of IPVS and ipset (moby/ipvs, vishvananda/netlink) among them.
package ipvsmode
