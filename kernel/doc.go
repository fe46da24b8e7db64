// Package kernel answers the questions a service proxy asks about the node's
// Linux kernel before it picks a mode: which kernel release is running,
// which modules are loaded or built in, whether IPVS mode can work here (and
// if not, exactly what is missing), and what a sysctl says or should say.
//
// Every file is read under an injectable root directory and modprobe runs
// through an injected k8s.io/utils/exec.Interface, so a test describes a node
// as a temporary directory tree (a /proc/sys/kernel/osrelease, a
// /proc/modules or its absence, a /proc/config.gz, a modules.builtin) and a
// fake exec, and never depends on the machine it runs on.
//
// It is not a sysctl manager or a module loader for arbitrary use: it reads
// and writes what it is asked to, once, and reports errors; it keeps no state
// and watches nothing. Conntrack tuning lives in package conntrack, which
// uses the helpers here.
//
// The smallest use:
//
//	k := kernel.New() // the real root and the real exec
//	if err := k.CanUseIPVS(ctx, "rr"); err != nil {
//		// err names every missing module; fall back to iptables mode
//	}
package kernel
