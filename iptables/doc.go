// Package iptables runs iptables, iptables-save and iptables-restore for a
// Kubernetes service proxy, and builds the input it feeds them.
//
// [Interface] is the kernel-facing part: create, flush and delete chains,
// ensure and delete single rules, save a table, and restore many rules at
// once with iptables-restore, for IPv4 or IPv6 and for either backend
// (legacy x_tables or nf_tables), which [New] detects the way the
// Kubernetes iptables-wrapper does unless told. It reads "iptables
// --version" to use what the installed binaries can do (waiting for the
// xtables lock, --random-fully) and degrades with clear errors on old ones.
// Failed commands return an *[Error] carrying the command line, exit
// status, standard error and the restore input line blamed; test them with
// [IsNotFound] and [IsLockTimeout]. [Interface.Monitor] notices when
// another program (firewalld, "iptables -F") wipes rules, through canary
// chains, and calls back so the caller can resync.
//
// [LineBuffer] builds iptables-restore input without allocating per line,
// and counts lines.
//
// [Writer] renders kube-proxy's service rules, full or partial, under
// kube-proxy's chain names by default. [ChainNames] derives every chain a
// proxy owns from one prefix (WriterConfig.ChainPrefix), so that two
// proxies, such as a proxykit proxier beside kube-proxy, each write, watch
// and clean up their own chains without touching the other's.
//
// Text from outside the program (names of API objects) reaches restore
// input only through [AppendRestoreText] and [AppendRestoreWord], which
// quote it so that no byte can end the word, the line or the table, and
// refuse what no quoting can carry (NUL, newline, overlong text). The
// service rule writer ([Writer]) also checks every other field a service
// port hands it and skips, with a log naming it, a port iptables-restore
// would refuse, so that one bad object never fails the sync of the
// others. Its [WriterConfig.LocalhostNodePorts] serves IPv4 node ports on
// 127.0.0.1 as kube-proxy's --iptables-localhost-nodeports does.
//
// Package github.com/proxykit/proxykit/iptables/iptablestest has a strict
// in-memory Fake of Interface, for unit tests without root, and a packet
// tracer that shows where a packet would go through the Fake's rules.
//
// This package does not decide what rules a proxy needs; that is the
// service rule writer's job. It does not talk to nf_tables directly
// (sigs.k8s.io/knftables does), and it never runs a shell.
//
// The smallest use:
//
//	ipt, err := iptables.New(ctx, v1.IPv4Protocol)
//	if err != nil {
//		return err
//	}
//	b := iptables.NewLineBuffer()
//	b.Write("*filter")
//	b.Write(":KUBE-FORWARD", "-", "[0:0]")
//	b.Write("-A", "KUBE-FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
//	b.Write("COMMIT")
//	err = ipt.RestoreAll(ctx, b.Bytes(), iptables.NoFlushTables, iptables.NoRestoreCounters)
//
// # iptables mode
//
// [Mode] is kube-proxy's iptables mode as a proxy.Backend: one Mode per IP
// family, in a BackendGroup of its own, renders the family's rules with
// the [Writer] (full or partial syncs, as kube-proxy's) and applies them
// with iptables-restore. Between syncs its Run watches a canary chain, and
// optionally compares the rules with what it applied (the top-level chains,
// and the per-service and per-endpoint chains), and asks for a full resync
// when another program removed or changed them. Made without an
// [Interface] it is a dry run that prints what it would apply. What the
// mode needs of the node beyond the rules (conntrack tuning,
// route_localnet for localhost node ports, removing another mode's rules)
// is package kubeproxy's, or the caller's:
//
//	node := proxy.NodeConfig{Name: nodeName, ClusterCIDRs: podCIDRs}
//	m, err := iptables.NewMode(ctx, iptables.WriterConfig{Family: v1.IPv4Protocol, Node: node}, ipt,
//		iptables.WithMetrics(metrics))
//	groups := []proxier.BackendGroup{{Backend: m, Families: []v1.IPFamily{v1.IPv4Protocol}}}
package iptables
