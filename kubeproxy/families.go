package kubeproxy

import (
	"context"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/proxier"
)

// sysctlDisableIPv6 is the sysctl that turns IPv6 off in a network
// namespace; it is missing where the kernel has no IPv6 at all.
const sysctlDisableIPv6 = "net/ipv6/conf/all/disable_ipv6"

// bothFamilies are the IP families, in the order they are probed.
var bothFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}

// familySupport is what the host supports of each IP family, and why not
// where it does not.
type familySupport map[v1.IPFamily]error

// decideFamilies returns the IP families to proxy on node, as kube-proxy
// decides them: the primary (node.Families[0], that of the node's first
// address, IPv4 when it has none) and, when the host supports both
// families, the other one too, whatever addresses the Node lists. It
// fails when the primary family is not supported. support says what the
// host supports.
func decideFamilies(node proxier.Node, support familySupport) ([]v1.IPFamily, error) {
	primary := node.Families[0]
	if err := support[primary]; err != nil {
		return nil, fmt.Errorf("no support for primary IP family %q: %w", primary, err)
	}
	families := []v1.IPFamily{primary}
	for _, f := range node.Families[1:] {
		if support[f] == nil {
			families = append(families, f)
		}
	}
	return families, nil
}

// hostSupport finds what the host supports, as kube-proxy's start-up does:
// in iptables and IPVS mode, each family whose iptables (of the backend
// this node uses) works, failing when neither does; in nftables mode both,
// since nft serves both; and IPv6 in no mode when the kernel has it off or
// has none. It returns the iptables Interfaces that work, by family (none
// in nftables mode). Every family not supported is logged with the reason.
func (s *setup) hostSupport(ctx context.Context) (familySupport, map[v1.IPFamily]iptables.Interface, error) {
	logger := klog.FromContext(ctx)
	support := familySupport{v1.IPv4Protocol: nil, v1.IPv6Protocol: nil}
	ipts := map[v1.IPFamily]iptables.Interface{}
	if !s.cfg.nftablesBased() {
		b, err := s.host.DetectBackend(ctx)
		if err != nil {
			return nil, nil, err
		}
		for _, f := range bothFamilies {
			ipt, err := s.usableIPTables(ctx, f, b)
			if err != nil {
				support[f] = err
				continue
			}
			ipts[f] = ipt
		}
		if len(ipts) == 0 {
			return nil, nil, fmt.Errorf("iptables is not available on this host: %w", support[v1.IPv4Protocol])
		}
		for _, f := range bothFamilies {
			if err := support[f]; err != nil {
				logger.Info("No iptables support for family", "ipFamily", f, "err", err)
			}
		}
	}
	if err := s.kernelIPv6(); err != nil {
		logger.Info("No kernel support for family", "ipFamily", v1.IPv6Protocol, "err", err)
		if support[v1.IPv6Protocol] == nil {
			support[v1.IPv6Protocol] = err
		}
		delete(ipts, v1.IPv6Protocol)
	}
	return support, ipts, nil
}

// kernelIPv6 returns why the kernel cannot serve IPv6 in this network
// namespace, or nil when it can.
func (s *setup) kernelIPv6() error {
	v, err := s.host.Kernel.ReadSysctl(sysctlDisableIPv6)
	if err != nil {
		return fmt.Errorf("the kernel has no IPv6: %w", err)
	}
	if strings.TrimSpace(v) == "1" {
		return fmt.Errorf("IPv6 is disabled (%s is 1)", sysctlDisableIPv6)
	}
	return nil
}

// families returns the families to proxy on node, with their iptables
// Interfaces in iptables and IPVS mode (nil in nftables mode), and logs
// whether the proxier runs single- or dual-stack. A dry run, which asks
// the host nothing, proxies the primary family and the other one when the
// node has an address of it.
func (s *setup) families(ctx context.Context, node proxier.Node) ([]v1.IPFamily, []iptables.Interface, error) {
	logger := klog.FromContext(ctx)
	if s.dryRun != nil {
		support := familySupport{}
		for _, f := range node.Families[1:] {
			if len(node.IPs[f]) == 0 {
				support[f] = fmt.Errorf("a dry run proxies the other family only when the node has an address of it")
			}
		}
		families, err := decideFamilies(node, support)
		return families, nil, err
	}
	support, byFamily, err := s.hostSupport(ctx)
	if err != nil {
		return nil, nil, err
	}
	families, err := decideFamilies(node, support)
	if err != nil {
		return nil, nil, err
	}
	if len(families) > 1 {
		logger.Info("Running in dual-stack mode", "primaryFamily", families[0])
	} else {
		logger.Info("Running in single-stack mode", "ipFamily", families[0])
	}
	var ipts []iptables.Interface
	if !s.cfg.nftablesBased() {
		for _, f := range families {
			ipts = append(ipts, byFamily[f])
		}
	}
	return families, ipts, nil
}
