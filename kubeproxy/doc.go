// Package kubeproxy turns a KubeProxyConfiguration, and the values of
// kube-proxy's flags, into a running proxier in kube-proxy's iptables,
// IPVS or nftables mode: what kube-proxy's cmd/kube-proxy does around its
// proxiers, made importable so that a second proxy built on proxykit need
// not copy it.
//
// It owns the decisions a proxier makes about the node rather than about
// Services: strict decoding of the configuration file (Decode), with the
// fields proxykit ignores named (Unsupported); kube-proxy's defaults and
// checks applied to it, giving a Config (FromConfiguration) and back
// (Config.Configuration), or a Config filled in from flags and checked
// (Validate); at start-up, conntrack tuning, the removal of the state
// another mode left, kube-proxy's per-family iptables probe with its
// fallback to single stack, route_localnet and IPVS mode's kernel checks;
// the mode's Backends (New); --init-only (InitNode) and --cleanup
// (Cleanup). It does not parse flags, open an API server client or serve
// /metrics: those are the command's (see examples/proxier).
//
// The smallest use, from a configuration file as kubeadm writes it:
//
//	kc, err := kubeproxy.Decode(data)
//	if err != nil {
//		return err
//	}
//	cfg, err := kubeproxy.FromConfiguration(kc)
//	if err != nil {
//		return err
//	}
//	p, err := kubeproxy.New(client, nodeName, cfg)
//	if err != nil {
//		return err
//	}
//	return p.Run(ctx)
//
// Everything it takes from the machine is in a Host (RealHost by
// default), which tests replace with fakes; WithDryRun prints what the
// first sync would apply and touches nothing.
package kubeproxy
