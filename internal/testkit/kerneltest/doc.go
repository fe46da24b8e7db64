// Package kerneltest is the harness for proxykit's kernel tests: tests that
// program the real kernel (iptables-restore, ipsets, conntrack, IPVS) and
// send real packets through it.
//
// Every kernel test runs inside network namespaces that it creates with
// [NewNS] and that are deleted when the test ends, whether it passes, fails
// or panics. Nothing here touches the namespace of the test process itself:
// links, addresses, routes and sysctls are only ever set inside a namespace
// the test owns, and traffic only goes to addresses inside those namespaces.
//
// A test starts with [Require], which skips it where the machine cannot run
// kernel tests (not root, a tool missing) and fails it instead when
// PROXYKIT_REQUIRE_KERNEL=1, so that CI cannot pass by skipping:
//
//	func TestReach(t *testing.T) {
//		kerneltest.Require(t, "iptables-restore")
//		client, server := kerneltest.NewNS(t), kerneltest.NewNS(t)
//		kerneltest.Link(t, client, server,
//			netip.MustParsePrefix("10.1.0.1/24"), netip.MustParsePrefix("10.1.0.2/24"))
//		kerneltest.StartBackend(t, server, "backend-a", 8080)
//		reply, err := kerneltest.Dial(client, "tcp", netip.MustParseAddrPort("10.1.0.2:8080"), time.Second)
//		// reply.Name == "backend-a", reply.Client == 10.1.0.1
//	}
//
// Namespaces are made over netlink and bind-mounted under /run/netns, so
// `ip netns list` shows them while they exist; no `ip` binary is needed,
// which lets the same harness run in the minimal VM used for IPVS tests.
// This package is internal: its API changes with proxykit's tests.
package kerneltest
