// Package conntracktest provides a fake conntrack.Interface for the tests of
// proxiers: an in-memory table that lists and deletes flows as the kernel
// does, rejects flows the kernel could not hold, and dumps its content as
// sorted text for golden comparisons.
//
//	fake := conntracktest.NewFake()
//	fake.AddFlows(conntracktest.NewFlow(conntrack.ProtocolUDP,
//		netip.MustParseAddrPort("10.0.0.2:40000"),  // client
//		netip.MustParseAddrPort("10.96.0.10:53"),   // service
//		netip.MustParseAddrPort("10.0.1.2:5353")))  // endpoint
//	n, err := conntrack.NewCleaner(fake).CleanStaleEntries(ctx, v1.IPv4Protocol, svcPortMap, endpointsMap, nil)
//	// fake.Dump() shows what is left
package conntracktest
