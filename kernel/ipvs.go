package kernel

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/klog/v2"
)

// Module names as modprobe knows them.
const (
	// ModuleIPVS is the IPVS core.
	ModuleIPVS = "ip_vs"
	// ModuleIPVSRR is the round-robin scheduler.
	ModuleIPVSRR = "ip_vs_rr"
	// ModuleIPVSWRR is the weighted round-robin scheduler.
	ModuleIPVSWRR = "ip_vs_wrr"
	// ModuleIPVSSH is the source-hashing scheduler.
	ModuleIPVSSH = "ip_vs_sh"
	// ModuleNFConntrack is connection tracking (IPv4 included from 4.19).
	ModuleNFConntrack = "nf_conntrack"
	// ModuleNFConntrackIPv4 is IPv4 connection tracking before 4.19.
	ModuleNFConntrackIPv4 = "nf_conntrack_ipv4"
	// ModuleIPSet is the ipset core.
	ModuleIPSet = "ip_set"
	// ModuleXTSet is the iptables "set" match and SET target.
	ModuleXTSet = "xt_set"
)

// defaultIPVSScheduler is the scheduler [Kernel.CanUseIPVS] checks when
// given none: kube-proxy's default, the value of ipvs.DefaultScheduler,
// which this package cannot import.
const defaultIPVSScheduler = "rr"

// RequiredIPVSModules returns the modules IPVS mode cannot run without on
// kernel v: ip_vs, the rr, wrr and sh schedulers, and connection tracking,
// which is nf_conntrack_ipv4 before 4.19 and nf_conntrack from 4.19 on (the
// IPv4 part was merged into nf_conntrack then). The slice is new on each
// call.
func RequiredIPVSModules(v Version) []string {
	conntrack := ModuleNFConntrack
	if !v.AtLeast(Version{Major: 4, Minor: 19}) {
		conntrack = ModuleNFConntrackIPv4
	}
	return []string{ModuleIPVS, ModuleIPVSRR, ModuleIPVSWRR, ModuleIPVSSH, conntrack}
}

// IPSetModules returns the modules behind the ipsets IPVS mode uses: the
// ipset core, the iptables "set" match, and the set types kube-proxy's IPVS
// mode creates (hash:ip,port, hash:ip,port,ip, hash:ip,port,net, hash:net,
// hash:net,port and bitmap:port). The slice is new on each call.
func IPSetModules() []string {
	return []string{
		ModuleIPSet, ModuleXTSet,
		"ip_set_hash_ipport", "ip_set_hash_ipportip", "ip_set_hash_ipportnet",
		"ip_set_hash_net", "ip_set_hash_netport", "ip_set_bitmap_port",
	}
}

// ipvsSchedulers are the scheduler names IPVS knows.
var ipvsSchedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos"}

// IPVSSchedulers returns the scheduler names IPVS knows, each provided by
// the module "ip_vs_" + name. The slice is new on each call.
func IPVSSchedulers() []string { return slices.Clone(ipvsSchedulers) }

// IPVSSchedulerModule returns the module that provides IPVS scheduler name
// ("rr" → "ip_vs_rr"), or an error for a name IPVS does not know.
func IPVSSchedulerModule(name string) (string, error) {
	if !slices.Contains(ipvsSchedulers, name) {
		return "", fmt.Errorf("unknown IPVS scheduler %q (known: %s)", name, strings.Join(ipvsSchedulers, ", "))
	}
	return "ip_vs_" + name, nil
}

// IPVSUnavailableError says why this node cannot run IPVS mode. Each field
// lists missing modules only, in a fixed order; a module appears in one
// field at most.
type IPVSUnavailableError struct {
	// Kernel is the running kernel's release.
	Kernel Version
	// Modules are the missing modules among [RequiredIPVSModules].
	Modules []string
	// Schedulers are the missing modules of the schedulers asked for,
	// other than those already in Modules.
	Schedulers []string
	// IPSet are the missing modules among [IPSetModules].
	IPSet []string
}

// Error names the kernel and each group of missing modules.
func (e *IPVSUnavailableError) Error() string {
	var parts []string
	for _, g := range []struct {
		what string
		mods []string
	}{{"IPVS modules", e.Modules}, {"scheduler modules", e.Schedulers}, {"ipset modules", e.IPSet}} {
		if len(g.mods) > 0 {
			parts = append(parts, "missing "+g.what+" "+strings.Join(g.mods, ", "))
		}
	}
	return fmt.Sprintf("kernel %s cannot run IPVS mode: %s", e.Kernel, strings.Join(parts, "; "))
}

// Missing returns every missing module, in the order of the fields.
func (e *IPVSUnavailableError) Missing() []string {
	return slices.Concat(e.Modules, e.Schedulers, e.IPSet)
}

// CanUseIPVS checks that this node can run IPVS mode with the given
// schedulers (none means "rr", ipvs.DefaultScheduler): the modules of
// [RequiredIPVSModules], each scheduler's module and the [IPSetModules]
// must be loaded or built in. Where the kernel supports loadable modules
// and k.Exec is set it tries modprobe for each missing one first and logs
// what loaded. It returns nil if everything is there, an
// *IPVSUnavailableError listing exactly what is missing, or another error
// for an unknown scheduler or unreadable files.
func (k *Kernel) CanUseIPVS(ctx context.Context, schedulers ...string) error {
	if len(schedulers) == 0 {
		schedulers = []string{defaultIPVSScheduler}
	}
	var schedMods []string
	for _, s := range schedulers {
		mod, err := IPVSSchedulerModule(s)
		if err != nil {
			return err
		}
		schedMods = append(schedMods, mod)
	}
	m, err := k.Modules(ctx)
	if err != nil {
		return fmt.Errorf("checking IPVS support: %w", err)
	}
	required := RequiredIPVSModules(m.Version)
	schedMods = slices.DeleteFunc(schedMods, func(mod string) bool { return slices.Contains(required, mod) })

	e := &IPVSUnavailableError{Kernel: m.Version}
	var loaded, l []string
	l, e.Modules = k.ensure(ctx, m, required)
	loaded = append(loaded, l...)
	l, e.Schedulers = k.ensure(ctx, m, schedMods)
	loaded = append(loaded, l...)
	l, e.IPSet = k.ensure(ctx, m, IPSetModules())
	loaded = append(loaded, l...)
	if len(loaded) > 0 {
		klog.FromContext(ctx).Info("Loaded kernel modules for IPVS", "modules", loaded)
	}
	if len(e.Missing()) > 0 {
		return e
	}
	return nil
}
