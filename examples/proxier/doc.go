// Command proxier is a Kubernetes node service proxy composed from the
// proxykit blocks: the reference composition to read, and to copy, when
// building a proxier of your own. It runs kube-proxy's iptables, IPVS or
// nftables mode, against an API server or against YAML manifests with no
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
// with no IPVS in the kernel needed, and
//
//	go run ./examples/proxier --manifests examples/proxier/testdata --dry-run --hostname-override node-a --mode nftables
//
// prints nftables mode's transactions, as nft -f takes them.
//
// # The composition
//
// The proxy is package github.com/proxykit/proxykit/proxier, around the
// Backends of kube-proxy's modes, which package
// github.com/proxykit/proxykit/kubeproxy makes from a KubeProxyConfiguration
// with the node set-up each mode needs (conntrack, IPVS sysctls,
// route_localnet, removing the other modes' leftovers), --init-only and
// --cleanup; this command is flags and main over it:
//
//		flags ──▶ options ──▶ kubeproxy.Config ──▶ kubeproxy.New(client, node, cfg, ...) ──▶ Run / RunOnce
//
//	  - main.go holds the environment (the kubeproxy.Host, what the proxier
//	    takes from the machine; tests replace it with fakes);
//	  - run.go opens the cluster (--manifests or the API server), runs the
//	    proxier, and serves /metrics;
//	  - options.go and flags.go are the flags, config.go the --config file
//	    (read with kubeproxy.Decode and kubeproxy.FromConfiguration),
//	    writeconfig.go --write-config-to, incluster.go where the API server
//	    is.
//
// # Flags
//
// kube-proxy's names: --config (a KubeProxyConfiguration file, as kubeadm
// deploys kube-proxy with; flags given on the command line override it,
// and the fields this proxier ignores are named in one warning),
// --kubeconfig and --master (neither means the in-cluster configuration),
// --hostname-override, --mode
// (iptables, ipvs or nftables; ipvs refuses, with the kernel's reason, on a
// kernel that cannot run it), --cluster-cidr, --masquerade-all,
// --nodeport-addresses, --iptables-localhost-nodeports (on by default, as
// in kube-proxy: IPv4 node ports on 127.0.0.1, with route_localnet set
// and other hosts' packets to 127.0.0.0/8 dropped), --healthz-bind-address,
// --metrics-bind-address,
// --sync-period, --min-sync-period, --cleanup (of every mode) and -v; and
// --manifests PATH (Services, EndpointSlices, Nodes and ServiceCIDRs from a
// YAML file or directory, followed for edits), --dry-run, --once and
// --iptables-drift-check-period (how often iptables mode checks that its
// rules, top-level and per-service chains, are still what it wrote) and --chain-prefix (the
// names of the chains, ipsets and nftables table the proxier owns, for
// running beside kube-proxy). See README.md
// beside this file for the details and the tests.
package main
