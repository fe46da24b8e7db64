// Package iptablestest is a strict in-memory fake of iptables, for testing
// code that uses [iptables.Interface] without root or a kernel.
//
// [Fake] implements iptables.Interface. It parses iptables-restore input
// and single commands the way the real binaries do and keeps each rule in
// the canonical form iptables-save prints ("-p tcp -m tcp --dport 80",
// "-s 10.0.0.1/32", "MARK --set-xmark 0x4000/0x4000"), so [Fake.Dump] can be
// compared with golden text or with real iptables-save output. It refuses
// what iptables or the kernel would refuse, with an *iptables.Error naming
// the line: jumps to missing chains, deleting a chain that is referenced
// or not empty, a missing COMMIT, an unknown table, NAT targets outside
// their hooks (also through user chains), loops, malformed options. Each
// table of a restore is applied at its COMMIT or not at all, as with the
// real iptables-restore. A restore costs time in proportion to its input,
// not to the square of the number of chains.
//
// [Fake.Trace] follows a packet through the rules and reports every way it
// can end (accepted, dropped, rejected), where DNAT sends it, whether it is
// masqueraded, and with what probability, following both branches of
// random load balancing and of ClientIP affinity. It lets users test a
// proxy's rules end to end in a unit test. Given an ipset fake
// ([WithIPSetFake] with an ipsettest.Fake), it decides "-m set" matches
// from the sets' members, so IPVS mode's rules can be traced too.
//
// The Fake models the matches and targets a service proxy uses: addresses,
// interfaces, protocols, tcp/udp/sctp ports, multiport, comment, mark,
// addrtype, conntrack and state, statistic, recent, set, physdev, nfacct
// (which counts nothing: [NFAcct] is the counters' fake); ACCEPT,
// DROP, RETURN, jumps and gotos, REJECT, DNAT, SNAT, MASQUERADE, MARK, LOG.
// Anything else is refused with an error that says the Fake does not
// support it, so a test never passes on input the Fake did not understand.
// It does not model counters, the security table's semantics, or the rest
// of the kernel (routing, conntrack entries, and ipset contents unless
// given an ipset fake); see
// [Fake.Trace] for what the trace assumes.
//
// The smallest use:
//
//	ipt := iptablestest.NewFake()
//	code := NewMyProxier(ipt) // takes an iptables.Interface
//	code.Sync()
//	if diff := cmp.Diff(wantDump, ipt.Dump()); diff != "" { ... }
package iptablestest
