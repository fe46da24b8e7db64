package proxy

import (
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"
)

// LocalMode is how the renderers tell traffic from this node's pods from
// other traffic (kube-proxy's detectLocalMode). That tells them which
// traffic to a cluster IP came from off the node, and is masqueraded, and
// which traffic to an external IP or load-balancer VIP of an
// externalTrafficPolicy Local service is a pod's, and goes to every
// endpoint.
type LocalMode string

// The local-detection modes, with kube-proxy's names and meaning.
const (
	// LocalModeClusterCIDR: a source inside the family's
	// NodeConfig.ClusterCIDRs prefix is a pod's. The default.
	LocalModeClusterCIDR LocalMode = "ClusterCIDR"
	// LocalModeNodeCIDR: a source inside the node's own pod range of the
	// family (its Node's spec.podCIDRs, FamilyInput.PodCIDRs) is a pod's.
	LocalModeNodeCIDR LocalMode = "NodeCIDR"
	// LocalModeBridgeInterface: a packet that came in through
	// NodeConfig.BridgeInterface is a pod's.
	LocalModeBridgeInterface LocalMode = "BridgeInterface"
	// LocalModeInterfaceNamePrefix: a packet that came in through an
	// interface whose name starts with NodeConfig.InterfaceNamePrefix is a
	// pod's.
	LocalModeInterfaceNamePrefix LocalMode = "InterfaceNamePrefix"
)

// maxInterfaceName is the longest Linux interface name (IFNAMSIZ less
// its terminating NUL).
const maxInterfaceName = 15

// ValidateInterfaceName checks that name can be a Linux interface name and
// is safe to hand to iptables and nft as one word: 1 to 15 ASCII letters,
// digits, '_', '.' or '-', not starting with '-' (which the tools would
// read as an option), and neither "." nor "..". The kernel allows more
// (any byte but '/', ':', NUL and white space), but quotes, '+', '*' and
// the like mean something to the rule languages; CNI plugins name their
// interfaces within this set.
func ValidateInterfaceName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("interface name must not be empty")
	case len(name) > maxInterfaceName:
		return fmt.Errorf("interface name %q is longer than %d characters", name, maxInterfaceName)
	case name == "." || name == "..":
		return fmt.Errorf("interface name %q is not allowed", name)
	case name[0] == '-':
		return fmt.Errorf("interface name %q starts with '-'", name)
	}
	for i := range len(name) {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '.' || c == '-') {
			return fmt.Errorf("interface name %q has a character other than letters, digits, '_', '.' and '-'", name)
		}
	}
	return nil
}

// ValidateInterfaceNamePrefix checks an interface name prefix: a valid
// interface name (ValidateInterfaceName) that leaves room for iptables'
// '+' wildcard, which counts towards the name's length: at most 14.
func ValidateInterfaceNamePrefix(prefix string) error {
	if err := ValidateInterfaceName(prefix); err != nil {
		return err
	}
	if len(prefix) >= maxInterfaceName {
		return fmt.Errorf("interface name prefix %q is too long: with iptables' wildcard it must fit in %d characters", prefix, maxInterfaceName)
	}
	return nil
}

// LocalDetector is the match, in iptables and nftables syntax, that tells
// traffic from this node's pods from other traffic, for one IP family:
// the source prefix of ClusterCIDR and NodeCIDR mode, the input interface
// of BridgeInterface and InterfaceNamePrefix mode. NodeConfig.LocalDetector
// makes it. The zero value detects nothing (Enabled is false): a renderer
// then leaves out the rules that need it, as kube-proxy does without a
// cluster CIDR. Two LocalDetectors are == when they match the same
// traffic the same way, so a renderer can compare the one of a sync with
// its last to tell that its rules must be rewritten.
type LocalDetector struct {
	mode  LocalMode
	cidr  netip.Prefix // ClusterCIDR and NodeCIDR mode
	iface string       // the bridge, or the name prefix
}

// Enabled reports whether d matches anything. The other methods return
// nil when it does not.
func (d LocalDetector) Enabled() bool { return d.mode != "" }

// IfLocal returns the iptables arguments that match traffic from this
// node's pods: "-s 10.244.0.0/16", "-i cni0" or "-i veth+".
func (d LocalDetector) IfLocal() []string {
	switch d.mode {
	case LocalModeClusterCIDR, LocalModeNodeCIDR:
		return []string{"-s", d.cidr.String()}
	case LocalModeBridgeInterface:
		return []string{"-i", d.iface}
	case LocalModeInterfaceNamePrefix:
		return []string{"-i", d.iface + "+"}
	}
	return nil
}

// IfNotLocal returns the iptables arguments that match the other traffic:
// IfLocal's, negated with "!".
func (d LocalDetector) IfNotLocal() []string {
	if !d.Enabled() {
		return nil
	}
	return append([]string{"!"}, d.IfLocal()...)
}

// IfLocalNFT returns the nftables expression that matches traffic from
// this node's pods, as words: "ip saddr 10.244.0.0/16" (ip6 for IPv6),
// `iifname "cni0"` or `iifname "veth*"`. Interface names are quoted, as
// nft lists them.
func (d LocalDetector) IfLocalNFT() []string { return d.nft(false) }

// IfNotLocalNFT returns the nftables expression that matches the other
// traffic: IfLocalNFT's with "!=".
func (d LocalDetector) IfNotLocalNFT() []string { return d.nft(true) }

func (d LocalDetector) nft(not bool) []string {
	var out []string
	switch d.mode {
	case LocalModeClusterCIDR, LocalModeNodeCIDR:
		out = []string{"ip", "saddr"}
		if d.cidr.Addr().Is6() {
			out[0] = "ip6"
		}
	case LocalModeBridgeInterface, LocalModeInterfaceNamePrefix:
		out = []string{"iifname"}
	default:
		return nil
	}
	if not {
		out = append(out, "!=")
	}
	switch d.mode {
	case LocalModeBridgeInterface:
		return append(out, `"`+d.iface+`"`)
	case LocalModeInterfaceNamePrefix:
		return append(out, `"`+d.iface+`*"`)
	}
	return append(out, d.cidr.String())
}

// LocalDetector returns the local-traffic detector of family for
// DetectLocalMode (ClusterCIDR when it is empty). podCIDRs are the node's
// pod ranges (FamilyInput.PodCIDRs), read in NodeCIDR mode alone: the
// first valid one of family is taken. The detector is off (the zero
// LocalDetector) in ClusterCIDR mode without a ClusterCIDRs prefix of
// family, and in NodeCIDR mode while the node has no pod range of family.
// It fails, naming the field, on an unknown mode, on two ClusterCIDRs
// prefixes of family, and on a BridgeInterface or InterfaceNamePrefix
// that its mode needs and that is not a valid interface name (see
// ValidateInterfaceName); the fields of the other modes are not read.
func (c *NodeConfig) LocalDetector(family v1.IPFamily, podCIDRs []netip.Prefix) (LocalDetector, error) {
	switch c.DetectLocalMode {
	case "", LocalModeClusterCIDR:
		cidr, err := c.ClusterCIDR(family)
		if err != nil {
			return LocalDetector{}, fmt.Errorf("ClusterCIDRs: %w", err)
		}
		if !cidr.IsValid() {
			return LocalDetector{}, nil
		}
		return LocalDetector{mode: LocalModeClusterCIDR, cidr: cidr}, nil
	case LocalModeNodeCIDR:
		for _, p := range podCIDRs {
			if p.IsValid() && FamilyOf(p.Addr()) == family {
				if p = unmapPrefix(p); p.IsValid() {
					return LocalDetector{mode: LocalModeNodeCIDR, cidr: p}, nil
				}
			}
		}
		return LocalDetector{}, nil
	case LocalModeBridgeInterface:
		if err := ValidateInterfaceName(c.BridgeInterface); err != nil {
			return LocalDetector{}, fmt.Errorf("BridgeInterface: %w", err)
		}
		return LocalDetector{mode: LocalModeBridgeInterface, iface: c.BridgeInterface}, nil
	case LocalModeInterfaceNamePrefix:
		if err := ValidateInterfaceNamePrefix(c.InterfaceNamePrefix); err != nil {
			return LocalDetector{}, fmt.Errorf("InterfaceNamePrefix: %w", err)
		}
		return LocalDetector{mode: LocalModeInterfaceNamePrefix, iface: c.InterfaceNamePrefix}, nil
	}
	return LocalDetector{}, fmt.Errorf("DetectLocalMode %q: want %s, %s, %s or %s", c.DetectLocalMode,
		LocalModeClusterCIDR, LocalModeNodeCIDR, LocalModeBridgeInterface, LocalModeInterfaceNamePrefix)
}
