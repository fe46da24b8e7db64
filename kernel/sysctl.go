package kernel

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"k8s.io/klog/v2"
)

// Sysctls a proxy commonly reads or sets, in the slash form /proc/sys uses.
const (
	// SysctlRouteLocalnet lets packets to 127.0.0.0/8 be routed, which
	// node ports on localhost need.
	SysctlRouteLocalnet = "net/ipv4/conf/all/route_localnet"
	// SysctlBridgeNFCallIPTables makes bridged IPv4 traffic pass iptables;
	// it exists only while br_netfilter is loaded.
	SysctlBridgeNFCallIPTables = "net/bridge/bridge-nf-call-iptables"
	// SysctlBridgeNFCallIP6Tables is SysctlBridgeNFCallIPTables for IPv6.
	SysctlBridgeNFCallIP6Tables = "net/bridge/bridge-nf-call-ip6tables"
	// SysctlIPForward turns IPv4 forwarding on.
	SysctlIPForward = "net/ipv4/ip_forward"
	// SysctlIPv6Forwarding turns IPv6 forwarding on.
	SysctlIPv6Forwarding = "net/ipv6/conf/all/forwarding"
	// SysctlVSConntrack keeps conntrack entries for IPVS connections, which
	// IPVS mode's iptables rules match on.
	SysctlVSConntrack = "net/ipv4/vs/conntrack"
	// SysctlVSExpireNoDestConn drops connections to a removed real server.
	SysctlVSExpireNoDestConn = "net/ipv4/vs/expire_nodest_conn"
	// SysctlVSExpireQuiescentTemplate expires persistence templates of a
	// real server with weight 0.
	SysctlVSExpireQuiescentTemplate = "net/ipv4/vs/expire_quiescent_template"
	// SysctlARPIgnore set to 1 stops the node answering ARP for IPVS
	// service addresses bound to the dummy interface (strict ARP).
	SysctlARPIgnore = "net/ipv4/conf/all/arp_ignore"
	// SysctlARPAnnounce set to 2 stops the node announcing those addresses
	// as ARP sources (strict ARP).
	SysctlARPAnnounce = "net/ipv4/conf/all/arp_announce"
)

// ErrReadOnly is wrapped by errors from writes to a sysctl or a module
// parameter on a file system mounted read-only, as /proc/sys and /sys often
// are in containers. Callers test for it with [IsReadOnly]; it means "this
// process may not change that here", not that the value is wrong. Other
// packages (conntrack's tuning) wrap it too.
var ErrReadOnly = errors.New("read-only file system")

// IsReadOnly reports whether err, or an error it wraps, is [ErrReadOnly]:
// the write was refused because the file system is mounted read-only.
func IsReadOnly(err error) bool {
	return errors.Is(err, ErrReadOnly)
}

// sysctlPath returns the path under /proc/sys of name, given either in slash
// form ("net/ipv4/ip_forward") or in dotted form ("net.ipv4.ip_forward").
// The dotted form cannot name an interface with a dot in its name; use
// slashes for those.
func sysctlPath(name string) (string, error) {
	rel := name
	if !strings.Contains(rel, "/") {
		rel = strings.ReplaceAll(rel, ".", "/")
	}
	if !validRelPath(rel) {
		return "", fmt.Errorf("invalid sysctl name %q", name)
	}
	return "/proc/sys/" + rel, nil
}

// ReadSysctl returns the value of sysctl name (slash or dotted form) with
// surrounding white space trimmed. A sysctl that does not exist (for
// example a bridge one while br_netfilter is not loaded) gives an error
// wrapping fs.ErrNotExist.
func (k *Kernel) ReadSysctl(name string) (string, error) {
	p, err := sysctlPath(name)
	if err != nil {
		return "", err
	}
	data, err := k.readFile(p)
	if err != nil {
		return "", fmt.Errorf("sysctl %s: %w", name, err)
	}
	return strings.TrimSpace(string(data)), nil
}

// ReadSysctlInt is ReadSysctl for a sysctl holding one integer.
func (k *Kernel) ReadSysctlInt(name string) (int, error) {
	s, err := k.ReadSysctl(name)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("sysctl %s: %w", name, err)
	}
	return n, nil
}

// WriteSysctl sets sysctl name (slash or dotted form) to value. It never
// creates a file: a sysctl that does not exist gives an error wrapping
// fs.ErrNotExist. When /proc/sys is mounted read-only the error wraps
// [ErrReadOnly] and nothing is written.
func (k *Kernel) WriteSysctl(ctx context.Context, name, value string) error {
	p, err := sysctlPath(name)
	if err != nil {
		return err
	}
	if err := k.writeFile(p, value); err != nil {
		return fmt.Errorf("sysctl %s: %w", name, err)
	}
	klog.FromContext(ctx).V(2).Info("Set sysctl", "name", name, "value", value)
	return nil
}

// EnsureSysctlInt sets sysctl name to value unless it already has that
// value, and reports whether it wrote. An unreadable current value is
// treated as different, so the write decides; errors are WriteSysctl's.
func (k *Kernel) EnsureSysctlInt(ctx context.Context, name string, value int) (bool, error) {
	if cur, err := k.ReadSysctlInt(name); err == nil && cur == value {
		return false, nil
	}
	if err := k.WriteSysctl(ctx, name, strconv.Itoa(value)); err != nil {
		return false, err
	}
	return true, nil
}

// moduleParameterPath returns /sys/module/MODULE/parameters/PARAM.
func moduleParameterPath(module, param string) (string, error) {
	module = normalizeModule(module)
	if !validRelPath(module) || strings.Contains(module, "/") || !validRelPath(param) || strings.Contains(param, "/") {
		return "", fmt.Errorf("invalid module parameter %s.%s", module, param)
	}
	return "/sys/module/" + module + "/parameters/" + param, nil
}

// ReadModuleParameter returns the value of a module parameter, from
// /sys/module/MODULE/parameters/PARAM, trimmed. The module must be loaded
// or built in for the file to exist; otherwise the error wraps
// fs.ErrNotExist.
func (k *Kernel) ReadModuleParameter(module, param string) (string, error) {
	p, err := moduleParameterPath(module, param)
	if err != nil {
		return "", err
	}
	data, err := k.readFile(p)
	if err != nil {
		return "", fmt.Errorf("module parameter %s.%s: %w", module, param, err)
	}
	return strings.TrimSpace(string(data)), nil
}

// WriteModuleParameter sets a module parameter through /sys. When /sys is
// mounted read-only (as container runtimes often mount it) the error wraps
// [ErrReadOnly] and nothing is written; a parameter that does not exist
// gives an error wrapping fs.ErrNotExist.
func (k *Kernel) WriteModuleParameter(ctx context.Context, module, param, value string) error {
	p, err := moduleParameterPath(module, param)
	if err != nil {
		return err
	}
	if err := k.writeFile(p, value); err != nil {
		return fmt.Errorf("module parameter %s.%s: %w", module, param, err)
	}
	klog.FromContext(ctx).V(2).Info("Set module parameter", "module", module, "parameter", param, "value", value)
	return nil
}

// writeFile writes value to the existing file at absolute path p under
// k.Root, after checking that no read-only mount covers p.
func (k *Kernel) writeFile(p, value string) error {
	full, err := k.path(p)
	if err != nil {
		return err
	}
	if mnt, ro := k.readOnlyMount(p); ro {
		return fmt.Errorf("%s: %w (%s is mounted read-only)", p, ErrReadOnly, mnt)
	}
	f, err := os.OpenFile(full, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return wrapWriteError(p, err)
	}
	_, werr := f.Write([]byte(value))
	cerr := f.Close()
	if werr != nil {
		return wrapWriteError(p, werr)
	}
	if cerr != nil {
		return wrapWriteError(p, cerr)
	}
	return nil
}

func wrapWriteError(p string, err error) error {
	err = unwrapPathError(err)
	if errors.Is(err, syscall.EROFS) {
		return fmt.Errorf("writing %s: %w (%w)", p, ErrReadOnly, err)
	}
	return fmt.Errorf("writing %s: %w", p, err)
}

// readOnlyMount reports whether the mount that holds absolute path p, as
// listed in /proc/mounts under k.Root, is read-only, and its mount point.
// When /proc/mounts cannot be read it reports false: the write itself will
// then fail with EROFS if the mount is read-only.
func (k *Kernel) readOnlyMount(p string) (string, bool) {
	data, err := k.readFile("/proc/mounts")
	if err != nil {
		return "", false
	}
	best, bestRO := "", false
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		mnt := unescapeMountPath(f[1])
		if !pathUnder(p, mnt) || len(mnt) < len(best) {
			continue
		}
		// Equal lengths: the later mount is on top.
		best = mnt
		bestRO = false
		for _, opt := range strings.Split(f[3], ",") {
			if opt == "ro" {
				bestRO = true
			}
		}
	}
	return best, bestRO
}

// pathUnder reports whether p is dir or below it.
func pathUnder(p, dir string) bool {
	if dir == "/" {
		return strings.HasPrefix(p, "/")
	}
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// unescapeMountPath undoes the octal escapes (\040 for a space) that
// /proc/mounts uses in paths.
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// OnlineCPUs returns how many CPUs are online, from
// /sys/devices/system/cpu/online ("0-3,6"). This counts the node's CPUs,
// unlike runtime.NumCPU, which counts the ones this process may use
// (kubernetes#99225).
func (k *Kernel) OnlineCPUs() (int, error) {
	data, err := k.readFile("/sys/devices/system/cpu/online")
	if err != nil {
		return 0, err
	}
	n, err := parseCPUList(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, fmt.Errorf("/sys/devices/system/cpu/online: %w", err)
	}
	return n, nil
}

// parseCPUList counts the CPUs in a kernel CPU list such as "0-3,6,8-9".
func parseCPUList(s string) (int, error) {
	if s == "" {
		return 0, fmt.Errorf("empty CPU list")
	}
	n := 0
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return 0, fmt.Errorf("bad CPU list %q", s)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return 0, fmt.Errorf("bad CPU list %q", s)
			}
		}
		n += b - a + 1
	}
	return n, nil
}
