// Package ipset manages Linux ipsets over netlink, with no ipset binary:
// creating, filling, listing, swapping and destroying the sets that an
// IPVS-mode proxier (or any iptables ruleset using "-m set") matches on,
// and a [Reconciler] that brings the sets under a name prefix to a desired
// state with the fewest kernel operations.
//
// Entries are typed values ([Entry]) with the ipset binary's string form
// ("10.0.0.1,tcp:80"); they are validated before anything is sent, so a
// malformed entry is an error that names it and never reaches the kernel.
// The set types supported are those kube-proxy's IPVS mode uses: hash:ip,
// hash:ip,port, hash:ip,port,ip, hash:ip,port,net, hash:net and
// bitmap:port, in both address families.
//
// It is not a general ipset library: timeouts, counters, comments, nomatch
// entries, list:set and the other types are not supported, and it does not
// write the iptables rules that reference the sets. The package
// ipset/ipsettest has a strict in-memory fake of [Interface] for unit tests.
//
// The smallest use, as root:
//
//	sets, err := ipset.New()
//	if err != nil { ... }
//	defer sets.Close()
//	r := ipset.NewReconciler(sets, "KUBE-")
//	_, err = r.Reconcile(ctx, []ipset.Desired{{
//		Set:     ipset.Set{Name: "KUBE-CLUSTER-IP", Type: ipset.HashIPPort},
//		Entries: []ipset.Entry{ipset.IPPortEntry(clusterIP, v1.ProtocolTCP, 443)},
//	}})
package ipset
