// Package nftablestest holds test helpers for the nftables package's
// rules: a packet tracer over the state of a knftables.Fake, and a check
// of a transaction against what the kernel would refuse that the Fake
// lets through.
//
// The tracer follows a new connection's first packet through the base
// chains of one table, the chains they jump to, verdict maps, sets and
// "numgen" load balancing (every branch of which it follows), and reports
// each outcome: accepted, dropped or rejected, the DNAT destination and
// whether the packet leaves masqueraded. It reads the data-map layout's
// lookups too: concatenated keys ("ip daddr . meta l4proto . th dport",
// "ip saddr . ip daddr") against verdict maps and sets, a "dnat ip to KEY
// map @endpoints" whose key ends in "numgen random mod N" (one outcome
// per index; an index without an element makes the rule not match, as in
// the kernel), "tcp dport" in a key (no match for another protocol), and
// "ct status dnat" (true once a rule rewrote the destination).
//
// A packet from outside (Packet.Output false) goes through prerouting,
// then input if its destination (after DNAT) is one of the node's
// addresses, else forward and postrouting. A node's packet goes through
// output and postrouting and, if its destination is the node's, back in
// over loopback through prerouting and input, as in the kernel: there
// only the filter chains run, since the kernel sets a connection's NAT up
// once (nat-output's DNAT and nat-postrouting's SNAT), and conntrack still
// calls the packet new, so "ct state new" rules match it again. Outcomes
// are in the order of the branches, whichever hook ended each.
//
// It understands the rule shapes that nftables.Writer writes, and reports
// an error on anything else rather than guessing, so a test that passes
// through it checks the rules it meant to.
//
//	fake := knftables.NewFake(knftables.IPv4Family, "kube-proxy")
//	// ... run a Writer's transactions on fake ...
//	tr := nftablestest.NewTracer(fake, knftables.IPv4Family, "kube-proxy", nodeIP)
//	outs, err := tr.Trace(nftablestest.Packet{Src: client, Dst: clusterIP, Protocol: v1.ProtocolTCP, DstPort: 80})
package nftablestest
