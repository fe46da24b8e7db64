// Package iptablesbackend is kube-proxy's iptables mode as a
// proxy.Backend: one Backend per IP family, in a BackendGroup of its
// own, renders the family's rules with the iptables service rule writer
// (full or partial syncs, as kube-proxy's) and applies them with
// iptables-restore; between syncs its Run watches a canary chain, and
// optionally compares the rules with what it applied (the top-level
// chains, and the per-service and per-endpoint chains), and asks for a
// full resync when another program removed or changed them. Made without an iptables.Interface it is a dry run
// that prints what it would apply.
//
// What the mode needs of the node beyond the rules (conntrack tuning,
// route_localnet for localhost node ports, removing another mode's rules)
// is the caller's: see examples/proxier's backends.go.
//
//	b, err := iptablesbackend.New(ctx, iptables.WriterConfig{IPFamily: v1.IPv4Protocol, NodeName: node.Name, NodeIPs: node.IPs[v1.IPv4Protocol]}, ipt,
//		iptablesbackend.WithMetrics(metrics))
//	groups := []proxier.BackendGroup{{Backend: b, Families: []v1.IPFamily{v1.IPv4Protocol}}}
//
// Importing it compiles 737 packages (go list -deps), no netlink.
package iptablesbackend
