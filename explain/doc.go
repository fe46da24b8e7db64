// Package explain answers "where does this packet go on this node, and
// why": it reads a node's service rules as the kernel holds them (the nat
// and filter tables of iptables-save, or the nftables table of nft list
// table), follows a packet through them with proxykit's tracers
// (iptables/iptablestest and nftables/nftablestest), and says every way the
// packet can end, with its probability: the endpoint it is DNATed to,
// whether it is masqueraded, or the rule that rejects or drops it, and the
// path of rules or chains that led there. It also compares two rule sets
// of a node, such as the live one and what proxykit would program for the
// same objects, over a grid of packets (drift).
//
// It works on a node programmed by proxykit or by kube-proxy, in iptables
// (legacy and nft backends) and nftables mode, since both write the same
// chain and table names by default. It never changes the kernel: reading
// needs CAP_NET_ADMIN, and an error names what could not be read (a tool
// missing, a table that does not exist, a permission denied) or, from the
// tracers, the rule they cannot interpret, rather than guessing.
//
// It is not a live packet capture: it follows the first packet of a new
// connection as the rules say it goes, with conntrack taken to hold
// nothing of it (no affinity yet, no existing NAT binding), and knows the
// node only by its addresses. The IPVS mode's virtual servers are not
// read.
//
// The smallest use reads the current network namespace's iptables rules
// and traces a pod's connection to a cluster IP:
//
//	rs, err := explain.ReadKernel(ctx, explain.Target{Mode: explain.ModeIPTables}, v1.IPv4Protocol)
//	// ...
//	node := explain.Node{Addrs: nodeIPs, PodAddr: []netip.Addr{netip.MustParseAddr("10.244.1.5")}}
//	ex, err := rs.Trace(explain.Packet{From: explain.FromPod(), Dest: netip.MustParseAddrPort("10.96.0.10:53"), Protocol: v1.ProtocolUDP}, node)
//	// ...
//	ex.WriteText(os.Stdout)
package explain
