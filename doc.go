// Package proxykit is a library of the building blocks of a Kubernetes
// service proxy: the parts of kube-proxy that live inside k8s.io/kubernetes,
// where nothing can import them, made into small packages that a CNI plugin,
// a service mesh or a custom proxy can use on their own.
//
// This root package holds no code; it is the map. The blocks are:
//
//   - [github.com/proxykit/proxykit/changetracker]: turns Service and
//     EndpointSlice events into the ServicePortMap and EndpointsMap a proxier
//     syncs from, with pending-change tracking, topology and traffic-policy
//     categorisation and dual-stack, with no client-go informers; the
//     informer glue is [github.com/proxykit/proxykit/proxier/config].
//   - [github.com/proxykit/proxykit/runner]: the bounded-frequency runner that
//     calls a sync function at most once per minimum interval and at least
//     once per maximum interval, retrying after errors.
//   - [github.com/proxykit/proxykit/iptables]: an Interface over
//     iptables-restore and iptables-save (legacy and nft), a strict in-memory
//     fake, and the service rule writer with full and partial syncs.
//   - [github.com/proxykit/proxykit/ipset] and
//     [github.com/proxykit/proxykit/ipvs]: netlink managers and reconcilers for
//     ipsets and IPVS virtual servers, with graceful termination.
//   - [github.com/proxykit/proxykit/kernel]: what this node's kernel can do
//     (version, modules, IPVS prerequisites) and sysctl access.
//   - [github.com/proxykit/proxykit/conntrack]: removal of stale UDP and SCTP
//     flows after a sync, and conntrack tuning.
//   - [github.com/proxykit/proxykit/healthz]: the proxy's own health server
//     and the per-service health-check node ports.
//   - [github.com/proxykit/proxykit/nftables]: the service rule writer of
//     kube-proxy's nftables layout, full and O(change) partial knftables
//     transactions, and a packet tracer for tests.
//   - [github.com/proxykit/proxykit/proxy]: the contract between a
//     composition and a datapath: Backend, FamilyInput, SyncResult,
//     NodeConfig, Metrics; proxy/proxytest has the Backend conformance
//     suite.
//   - [github.com/proxykit/proxykit/portcheck]: the checks the writers make
//     of every field they program, for custom Backends too.
//   - [github.com/proxykit/proxykit/ipvsmode]: kube-proxy's IPVS mode: the
//     writer of virtual servers, ipsets and rules, and its Mode.
//   - [github.com/proxykit/proxykit/proxier]: the composition of the blocks
//     into a whole proxy around a Backend; kube-proxy's modes are ready
//     Backends: iptables.Mode, nftables.Mode and ipvsmode.Mode.
//   - [github.com/proxykit/proxykit/kubeproxy]: a KubeProxyConfiguration (or
//     kube-proxy's flags) to a running proxier in any of the three modes,
//     with their node set-up and the cleanup of the other modes' state.
//
// # The data path
//
// Data flows in one direction through the blocks:
//
//	informers ─▶ changetracker ─▶ runner ─▶ backend (iptables | ipvs+ipset | nftables) ─▶ kernel
//	                                          └─▶ conntrack cleanup, healthz
//
// Event handlers feed Service and EndpointSlice changes to the change
// trackers and ask the runner for a sync. The runner calls the proxier's
// sync function, which takes the pending changes (ServicePortMap.Update and
// EndpointsMap.Update), renders the desired kernel state with a backend,
// applies it, clears stale conntrack entries and reports health. Each block
// has an Interface with a Linux implementation, a stub that returns a clear
// "not supported" error on other systems, and a faithful fake for unit tests.
//
// # Writing a proxy with a custom Backend
//
// A proxy built on proxykit writes only its datapath: a proxy.Backend,
// whose Sync gets each IP family's ServicePortMap and EndpointsMap, what
// changed in them, the node's addresses and whether everything must be
// rewritten (proxy.FamilyInput), and whose Run watches between syncs for
// its state being removed. proxier.New(client, nodeName, newBackends, options...) and Run
// do the rest: informers with kube-proxy's selectors, trackers per family,
// runners with min, max and retry periods, node topology, conntrack
// cleanup, the health servers and kube-proxy's metrics on a registerer of
// the caller's. The proxier package's Example is a whole Backend in a few
// dozen lines.
//
// # Fakes for tests
//
// Every block with a kernel side keeps its fake in a sub-package named
// after the block with a "test" suffix, in a directory of the same name, as
// the standard library's net/http/httptest is:
//
//	import (
//		"testing"
//
//		"github.com/proxykit/proxykit/conntrack/conntracktest"
//		"github.com/proxykit/proxykit/ipset/ipsettest"
//		"github.com/proxykit/proxykit/iptables/iptablestest"
//		"github.com/proxykit/proxykit/ipvs/ipvstest"
//		"github.com/proxykit/proxykit/nftables/nftablestest"
//	)
//
// so a test file imports the standard library's testing package and any
// number of fakes without aliases. Each fake implements its block's
// Interface and fails where the kernel would.
//
// # The reference composition
//
// The example binary in examples/proxier is main over package kubeproxy:
// kube-proxy's flags, --manifests (bundled YAML instead of an API server),
// --dry-run, --once and --cleanup, in iptables, IPVS or nftables mode
// (--mode ipvs, --mode nftables); starting in one mode removes what the
// others left. Package kubeproxy makes the modes' Backends with the node
// set-up each needs:
//
//	go run ./examples/proxier --manifests examples/proxier/testdata --dry-run --hostname-override node-a
//
// prints the rules it would apply for the bundled demo cluster.
package proxykit
