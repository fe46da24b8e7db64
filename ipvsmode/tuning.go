package ipvsmode

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/kernel"
)

// Tuning is the node set-up that kube-proxy's ipvs section asks for on top
// of what IPVS mode always needs ([TuneKernel]): strictARP and the IPVS
// connection timeouts. The zero Tuning asks for nothing. Both settings are
// per network namespace.
type Tuning struct {
	// StrictARP sets net/ipv4/conf/all/arp_ignore to 1 and
	// net/ipv4/conf/all/arp_announce to 2, kube-proxy's ipvs.strictARP:
	// the node then answers ARP only for addresses of the interface the
	// request came in on, and never announces the service addresses
	// bound to the dummy interface, which a layer-2 load balancer (such
	// as MetalLB's) announces instead. false leaves both sysctls as they
	// are: nothing ever sets them back, as in kube-proxy.
	StrictARP bool
	// Timeouts are the namespace's IPVS connection timeouts, kube-proxy's
	// ipvs.tcpTimeout, ipvs.tcpFinTimeout and ipvs.udpTimeout; a zero
	// field leaves that timeout as the kernel has it, and all zero sets
	// none. Each must be a whole number of seconds, as the kernel keeps
	// them.
	Timeouts ipvs.Timeouts
}

// Validate checks t as [Tune] does before it changes anything: the
// timeouts must be whole numbers of seconds, 0 to 2^31-1. The error
// names the timeout.
func (t Tuning) Validate() error {
	return t.Timeouts.Validate()
}

// Tune applies t: the strict-ARP sysctls through k, then the connection
// timeouts through iface, with the IPVS generic netlink command that
// `ipvsadm --set` sends. It is meant to run once at start, after
// [TuneKernel], as kube-proxy does; running it again changes nothing. A
// zero Tuning touches neither k nor iface, so a nil iface is accepted
// when t.Timeouts is zero. It fails, having changed nothing, when t does
// not validate; otherwise it stops at the first setting the kernel
// refuses, with an error naming it (and wrapping kernel.ErrReadOnly when
// /proc/sys is read-only).
func Tune(ctx context.Context, k *kernel.Kernel, iface ipvs.Interface, t Tuning) error {
	if err := t.Validate(); err != nil {
		return fmt.Errorf("IPVS mode: %w", err)
	}
	logger := klog.FromContext(ctx)
	if t.StrictARP {
		for _, s := range []struct {
			name  string
			value int
		}{{kernel.SysctlARPIgnore, 1}, {kernel.SysctlARPAnnounce, 2}} {
			wrote, err := k.EnsureSysctlInt(ctx, s.name, s.value)
			if err != nil {
				return fmt.Errorf("IPVS mode: strict ARP: %w", err)
			}
			if wrote {
				logger.V(1).Info("Set sysctl for strict ARP", "name", s.name, "value", s.value)
			}
		}
	}
	if t.Timeouts == (ipvs.Timeouts{}) {
		return nil
	}
	if iface == nil {
		return errors.New("IPVS mode: connection timeouts: no IPVS table to set them on")
	}
	if err := iface.SetTimeouts(ctx, t.Timeouts); err != nil {
		return fmt.Errorf("IPVS mode: connection timeouts: %w", err)
	}
	logger.V(1).Info("Set IPVS connection timeouts", "timeouts", t.Timeouts.String())
	return nil
}

// WithExcludeCIDRs makes the Mode leave alone the kernel's virtual servers
// whose address is in one of cidrs, kube-proxy's ipvs.excludeCIDRs: they
// belong to someone else (another load balancer on the node, say), and no
// sync deletes them, although the Mode owns every other virtual server of
// the namespace. A virtual server the Mode itself wants is still written,
// whatever its address. Pass the same prefixes to
// CleanupConfig.ExcludeCIDRs for Cleanup to leave them too. Several calls
// add up.
func WithExcludeCIDRs(cidrs ...netip.Prefix) ModeOption {
	return func(b *Mode) { b.exclude = append(b.exclude, cidrs...) }
}
