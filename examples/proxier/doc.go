// Command proxier is a Kubernetes node service proxy composed from the
// proxykit blocks: the reference composition to read, and to copy, when
// building a proxier of your own. It runs against an API server, or
// against YAML manifests with no cluster at all:
//
//	go run ./examples/proxier --manifests examples/proxier/testdata --dry-run --hostname-override node-a
//
// prints the iptables-restore input of the first full sync for the bundled
// demo cluster, touching nothing and needing no privileges.
//
// # The composition
//
// Data flows one way, each step a block:
//
//		informers ──▶ changetracker ──▶ runner ──▶ backend ──▶ kernel
//		(run.go)      (handlers,        (run.go)   (backend_iptables.go:
//		               proxier.go)                  iptables.Writer ──▶ Interface.RestoreAll)
//		                                    └──▶ conntrack cleanup, healthz, metrics (proxier.go)
//
//	  - run.go wires it up: the node's own Node object (through
//	    changetracker.NodeTopology) gives its topology labels and its
//	    addresses, and so the IP families to proxy; one familyProxier per
//	    family gets a change-tracker pair, a backend and a runner.Runner;
//	    Service and EndpointSlice informers feed every family's trackers.
//	  - proxier.go has the per-family sync: bring the maps up to date,
//	    have the backend apply them, then clear stale conntrack entries,
//	    update the health servers and observe the metrics.
//	  - backend.go is the interface a proxy mode implements for one family;
//	    backend_iptables.go is iptables mode: the service rule writer renders
//	    full or partial iptables-restore input, the Interface applies it, and
//	    its Monitor canary turns a flush by another program into a full
//	    resync.
//	  - metrics.go has kube-proxy's metric names; node.go, options.go and
//	    modes.go the node addresses, the flags, and --cleanup and --mode ipvs.
//
// # Flags
//
// kube-proxy's names: --kubeconfig, --master, --hostname-override, --mode
// (iptables; ipvs checks the kernel and refuses for now), --cluster-cidr,
// --masquerade-all, --nodeport-addresses, --healthz-bind-address,
// --metrics-bind-address, --sync-period, --min-sync-period, --cleanup and
// -v; and --manifests PATH (Services, EndpointSlices and Nodes from a YAML
// file or directory, followed for edits), --dry-run and --once. See
// README.md beside this file for the details and the tests.
package main
