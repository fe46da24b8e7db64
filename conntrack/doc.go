// Package conntrack keeps the kernel's connection tracking table in step
// with a proxy's services, and tunes its size and timeouts.
//
// [Cleaner.CleanStaleEntries] runs after a successful sync. UDP has no connection to
// close, so a conntrack entry that DNATs a service address to an endpoint
// outlives the endpoint and keeps sending a client's packets to it, or keeps
// black-holing them when the entry was made while the service had no
// endpoints. It lists the table once and deletes the UDP (optionally SCTP)
// entries whose original destination is a service IP:port or node port but
// whose reply source is not one of that service's serving endpoints; every
// other entry is left alone, so a proxy restart does not disturb healthy
// flows. [Tune] sets nf_conntrack_max (and the hash size), the TCP and UDP
// timeouts and tcp_be_liberal, as kube-proxy does at start.
//
// It talks to the kernel over netlink (vishvananda/netlink); no conntrack
// binary is needed. [WithNetNSPath] makes [New] work in another network
// namespace. conntrack/conntracktest has a
// fake [Interface] for proxier tests. It is not a general conntrack client:
// it lists and deletes flows and nothing else.
//
// The smallest use, after each successful sync:
//
//	cleaner := conntrack.NewCleaner(conntrack.New())
//	n, err := cleaner.CleanStaleEntries(ctx, v1.IPv4Protocol, svcPortMap, endpointsMap, deletedUDPClusterIPs)
//
// A Cleaner is a proxier.ConntrackCleaner: proxier.WithConntrack(cleaner).
package conntrack
