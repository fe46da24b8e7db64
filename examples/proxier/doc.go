// Command proxier is a Kubernetes node service proxy composed from the
// proxykit blocks: the reference composition to read, and to copy, when
// building a proxier of your own. It runs kube-proxy's iptables mode or its
// IPVS mode, against an API server or against YAML manifests with no
// cluster at all:
//
//	go run ./examples/proxier --manifests examples/proxier/testdata --dry-run --hostname-override node-a
//
// prints the iptables-restore input of the first full sync for the bundled
// demo cluster, touching nothing and needing no privileges, and
//
//	go run ./examples/proxier --manifests examples/proxier/testdata --dry-run --hostname-override node-a --mode ipvs
//
// prints IPVS mode's virtual servers, ipsets and iptables-restore input,
// with no IPVS in the kernel needed.
//
// # The composition
//
// Data flows one way, each step a block:
//
//		informers ──▶ changetracker ──▶ runner ──▶ backend ──▶ kernel
//		(run.go)      (handlers,        (run.go)   backend_iptables.go: iptables.Writer ──▶ Interface.RestoreAll
//		               proxier.go)         │       backend_ipvs.go: ipvs.Translator ──▶ ipvs.Applier
//		                                   └──▶ conntrack cleanup, healthz, metrics (proxier.go)
//
//	  - run.go wires it up: the node's own Node object (through
//	    changetracker.NodeTopology) gives its topology labels and its
//	    addresses, and so the IP families to proxy; each family gets a
//	    familyProxier with a change-tracker pair; each backend of the mode
//	    gets the families it serves and a runner.Runner. Service and
//	    EndpointSlice informers feed every family's trackers.
//	  - proxier.go has the sync a runner calls (syncGroup.sync): bring the
//	    maps up to date, have the backend apply them, then clear stale
//	    conntrack entries, update the health servers and observe the
//	    metrics, per family.
//	  - backend.go is the interface a proxy mode implements.
//	    backend_iptables.go is iptables mode, a backend per family: the
//	    service rule writer renders full or partial iptables-restore input,
//	    the Interface applies it, and its Monitor canary turns a flush by
//	    another program into a full resync. backend_ipvs.go is IPVS mode,
//	    one backend for every family: a translator per family renders the
//	    virtual servers, ipsets and rules, and one ipvs.Applier applies all
//	    families' translations in one call, since the kernel keeps both
//	    families' virtual servers and sets in one table.
//	  - metrics.go has kube-proxy's metric names; modes.go --cleanup and
//	    the removal of the other mode's leftovers when the mode changes;
//	    node.go and options.go the node addresses and the flags; config.go
//	    the --config file; incluster.go where the API server is.
//
// # Flags
//
// kube-proxy's names: --config (a KubeProxyConfiguration file, as kubeadm
// deploys kube-proxy with; flags given on the command line override it,
// and the fields this proxier ignores are named in one warning),
// --kubeconfig and --master (neither means the in-cluster configuration),
// --hostname-override, --mode
// (iptables or ipvs; ipvs refuses, with the kernel's reason, on a kernel
// that cannot run it), --cluster-cidr, --masquerade-all,
// --nodeport-addresses, --iptables-localhost-nodeports (on by default, as
// in kube-proxy: IPv4 node ports on 127.0.0.1, with route_localnet set
// and other hosts' packets to 127.0.0.0/8 dropped), --healthz-bind-address,
// --metrics-bind-address,
// --sync-period, --min-sync-period, --cleanup (of both modes) and -v; and
// --manifests PATH (Services, EndpointSlices and Nodes from a YAML file or
// directory, followed for edits), --dry-run, --once and
// --iptables-drift-check-period (how often iptables mode checks that no
// service's top-level rule was deleted by hand). See README.md
// beside this file for the details and the tests.
package main
