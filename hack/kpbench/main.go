// Command kpbench measures kube-proxy and proxykit side by side, on the
// same work: one generated cluster (N ClusterIP Services of one TCP port,
// M ready endpoints each), fed object by object to kube-proxy's iptables or
// nftables Proxier (k8s.io/kubernetes at the release go.mod pins) and to
// proxykit's change trackers and rule writer of the same mode, each synced
// through the same steps:
//
//   - first full sync: every Service and EndpointSlice handed to the
//     handlers, then the first sync;
//   - one-endpoint change: one Service's slice with one endpoint replaced,
//     then a sync;
//   - Service add: a new Service and its slice, then a sync;
//   - unchanged resync: a sync with nothing changed (the periodic one);
//   - forced full resync: a sync made full (kube-proxy: as after a node
//     topology change; proxykit: FamilyInput.Full, as after a lost table).
//
// Each side's work is the trackers' Update, the render and what the kernel
// tool is handed: the iptables-restore input, or the nft -f text of the
// transaction (knftables' Transaction.String, for both sides), and on
// proxykit's side what nftables mode sends through netlink instead, as it
// does over a real nft (the elements of a split first load, the element
// batches of partial syncs: their messages as ApplyElementBatch sends
// them). Neither side runs a kernel tool: stand-ins
// count the bytes and answer both sides' listings of the table, and
// proxykit's reads of the nf_tables generation, as the kernel would (see
// kernel.go). kube-proxy's Proxiers are made with their exported
// NewProxier; the fields that reach the host (nfacct, conntrack, the nft
// Interface) are then replaced by the fakes kube-proxy's own tests use, or
// the stand-ins.
//
// Each side and mode runs in processes of its own, kube-proxy's and
// proxykit's in turn (kp pk kp pk …), and each process reports its CPU time
// (getrusage: user+sys, all threads, less the stand-in kernel's bookkeeping)
// per step, its heap and its peak RSS. The driver prints, for each size and
// mode, the medians and their ratio kp / pk (above 1: proxykit spends less).
//
//	go run . -scales 1000x10,10000x10,5000x100 -count 3
//
// make bench-kubeproxy runs it from the repository's root.
package main

import "os"

func main() {
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(driverMain(os.Args[1:], os.Stdout, os.Stderr))
}
