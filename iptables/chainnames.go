package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"strings"

	"github.com/proxykit/proxykit/changetracker"
)

// The top-level chains of the service rules, named as kube-proxy names
// them. The writer fills them; built-in chains jump to them (see
// Writer.JumpRules). A writer with another WriterConfig.ChainPrefix uses the
// names its [ChainNames] give instead.
const (
	// KubeServicesChain (nat and filter) matches traffic to service
	// addresses: in nat it sends it to the per-service chains, in filter
	// it rejects traffic to cluster IPs without endpoints.
	KubeServicesChain Chain = "KUBE-SERVICES"
	// KubeExternalServicesChain (filter) rejects or drops traffic to
	// external addresses (node ports, external IPs, load-balancer VIPs) of
	// services without usable endpoints.
	KubeExternalServicesChain Chain = "KUBE-EXTERNAL-SERVICES"
	// KubeNodePortsChain (nat) sends node-port traffic to the per-service
	// chains; (filter) accepts health-check node ports.
	KubeNodePortsChain Chain = "KUBE-NODEPORTS"
	// KubePostroutingChain (nat) masquerades the traffic that
	// KubeMarkMasqChain marked.
	KubePostroutingChain Chain = "KUBE-POSTROUTING"
	// KubeMarkMasqChain (nat) marks a packet for masquerading.
	KubeMarkMasqChain Chain = "KUBE-MARK-MASQ"
	// KubeForwardChain (filter) drops conntrack-INVALID packets and
	// accepts forwarded service traffic.
	KubeForwardChain Chain = "KUBE-FORWARD"
	// KubeProxyFirewallChain (filter) drops load-balancer traffic from
	// sources outside loadBalancerSourceRanges.
	KubeProxyFirewallChain Chain = "KUBE-PROXY-FIREWALL"
)

// Prefixes of the per-service and per-endpoint chains, with
// [DefaultChainPrefix]. A hash of the service port (and endpoint) follows,
// so that names are stable across restarts and fit iptables' 28-character
// limit.
const (
	// ServiceClusterChainPrefix starts a service port's chain for traffic
	// under the Cluster policy (KUBE-SVC-*): it picks among all usable
	// endpoints.
	ServiceClusterChainPrefix = "KUBE-SVC-"
	// ServiceLocalChainPrefix starts a service port's chain for traffic
	// under the Local policy (KUBE-SVL-*): it picks among the node's own
	// endpoints.
	ServiceLocalChainPrefix = "KUBE-SVL-"
	// ServiceExternalChainPrefix starts a service port's chain for external
	// traffic (KUBE-EXT-*): node ports, external IPs, load-balancer VIPs.
	ServiceExternalChainPrefix = "KUBE-EXT-"
	// ServiceFirewallChainPrefix starts a service port's chain enforcing
	// loadBalancerSourceRanges (KUBE-FW-*).
	ServiceFirewallChainPrefix = "KUBE-FW-"
	// EndpointChainPrefix starts an endpoint's chain (KUBE-SEP-*), which
	// DNATs to the endpoint.
	EndpointChainPrefix = "KUBE-SEP-"
)

// hashLen is the length of the hash part of a chain name: 16 base32
// characters, 80 bits of SHA-256, as kube-proxy uses.
const hashLen = 16

// chainKind says which of the per-service chains a name is.
type chainKind uint8

const (
	kindSVC chainKind = iota
	kindSVL
	kindEXT
	kindFW
	kindSEP
	numChainKinds
)

// ChainPrefixMaxLen is the longest chain prefix a [ChainNames] takes: a
// per-service chain is PREFIX-SVC- and a 16-character hash, and iptables
// refuses chain names longer than 28 characters.
const ChainPrefixMaxLen = 28 - len("-SVC-") - hashLen

// DefaultChainPrefix is the chain prefix of kube-proxy, which names its
// chains KUBE-SERVICES, KUBE-SVC-*, and so on.
const DefaultChainPrefix = "KUBE"

// ChainNames names every chain that one service proxy owns in iptables,
// all of them starting with one prefix and a dash: PREFIX-SERVICES,
// PREFIX-SVC-<hash>, PREFIX-PROXY-CANARY, and so on. Two proxies with
// different prefixes own disjoint sets of chains, so each can write,
// partially sync and clean up its own without touching the other's: that
// is how a proxy built on this package runs beside kube-proxy, or beside
// another proxy serving other Services (KEP-2447,
// service.kubernetes.io/service-proxy-name). The hashes of per-service and
// per-endpoint chains do not depend on the prefix, so with
// [DefaultChainPrefix] every name is kube-proxy's.
//
// Build one with [NewChainNames]; the zero value names nothing and must
// not be used. A ChainNames is immutable and safe for concurrent use.
type ChainNames struct {
	prefix string
	// kinds are the prefixes of the per-service and per-endpoint chains,
	// "PREFIX-SVC-" and so on, computed once so that writing a chain name
	// costs one append.
	kinds [numChainKinds]string
	// The top-level chains and the canary.
	services, external, nodePorts, postrouting Chain
	markMasq, forward, fw, canary              Chain
}

// NewChainNames returns the names of the chains with prefix; "" means
// [DefaultChainPrefix]. The prefix must be 1 to [ChainPrefixMaxLen]
// characters, a letter followed by letters, digits or underscores: no
// dash, so that the first dash of a chain name ends its prefix and two
// prefixes never own each other's chains, and nothing iptables-restore
// would split or misread. Every name then has a dash in it, so none can
// be a built-in chain (INPUT, POSTROUTING) or a target (ACCEPT, DROP).
func NewChainNames(prefix string) (*ChainNames, error) {
	if prefix == "" {
		prefix = DefaultChainPrefix
	}
	if err := validChainPrefix(prefix); err != nil {
		return nil, fmt.Errorf("chain prefix %q: %w", prefix, err)
	}
	p := prefix + "-"
	n := &ChainNames{
		prefix:      prefix,
		services:    Chain(p + "SERVICES"),
		external:    Chain(p + "EXTERNAL-SERVICES"),
		nodePorts:   Chain(p + "NODEPORTS"),
		postrouting: Chain(p + "POSTROUTING"),
		markMasq:    Chain(p + "MARK-MASQ"),
		forward:     Chain(p + "FORWARD"),
		fw:          Chain(p + "PROXY-FIREWALL"),
		canary:      Chain(p + "PROXY-CANARY"),
	}
	for k, s := range kindSuffixes {
		n.kinds[k] = p + s
	}
	return n, nil
}

func validChainPrefix(prefix string) error {
	if len(prefix) > ChainPrefixMaxLen {
		return fmt.Errorf("longer than %d characters, which would make chain names longer than iptables' 28", ChainPrefixMaxLen)
	}
	for i := 0; i < len(prefix); i++ {
		c := prefix[i]
		switch {
		case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z':
		case i > 0 && ('0' <= c && c <= '9' || c == '_'):
		case i == 0:
			return fmt.Errorf("must start with a letter")
		default:
			return fmt.Errorf("character %q at %d: only letters, digits and underscores", c, i)
		}
	}
	return nil
}

// defaultNames are kube-proxy's names, behind the package-level constants.
var defaultNames = func() *ChainNames {
	n, err := NewChainNames(DefaultChainPrefix)
	if err != nil {
		panic(err)
	}
	return n
}()

// DefaultChainNames returns the names with [DefaultChainPrefix]:
// kube-proxy's, the ones the package-level constants give. Every call
// returns the same names, which no method changes.
func DefaultChainNames() *ChainNames { return defaultNames }

// Prefix returns the prefix, without the dash that follows it in names.
func (n *ChainNames) Prefix() string { return n.prefix }

// Services returns PREFIX-SERVICES, the chain of [KubeServicesChain]'s role.
func (n *ChainNames) Services() Chain { return n.services }

// ExternalServices returns PREFIX-EXTERNAL-SERVICES, the chain of
// [KubeExternalServicesChain]'s role.
func (n *ChainNames) ExternalServices() Chain { return n.external }

// NodePorts returns PREFIX-NODEPORTS, the chain of [KubeNodePortsChain]'s
// role.
func (n *ChainNames) NodePorts() Chain { return n.nodePorts }

// Postrouting returns PREFIX-POSTROUTING, the chain of
// [KubePostroutingChain]'s role.
func (n *ChainNames) Postrouting() Chain { return n.postrouting }

// MarkMasq returns PREFIX-MARK-MASQ, the chain of [KubeMarkMasqChain]'s
// role.
func (n *ChainNames) MarkMasq() Chain { return n.markMasq }

// Forward returns PREFIX-FORWARD, the chain of [KubeForwardChain]'s role.
func (n *ChainNames) Forward() Chain { return n.forward }

// ProxyFirewall returns PREFIX-PROXY-FIREWALL, the chain of
// [KubeProxyFirewallChain]'s role.
func (n *ChainNames) ProxyFirewall() Chain { return n.fw }

// Canary returns PREFIX-PROXY-CANARY, the proxy's canary chain for
// [Interface.Monitor] (kube-proxy's is [ProxyCanaryChain]).
func (n *ChainNames) Canary() Chain { return n.canary }

// Custom returns PREFIX-suffix: a chain of the proxy's own that this
// package does not name (IPVS mode's PREFIX-NODE-PORT, say). Such a chain
// is not among those [ChainNames.IsWriterChain] accepts; the caller's own
// ChainOwner must. suffix is not checked: pass a constant of
// capital letters and dashes.
func (n *ChainNames) Custom(suffix string) Chain { return Chain(n.prefix + "-" + suffix) }

// kindSuffixes follow the prefix and its dash in the per-service and
// per-endpoint chain names.
var kindSuffixes = [numChainKinds]string{
	kindSVC: "SVC-",
	kindSVL: "SVL-",
	kindEXT: "EXT-",
	kindFW:  "FW-",
	kindSEP: "SEP-",
}

// chainHash is the hash part of a per-service or per-endpoint chain name.
type chainHash [hashLen]byte

// chainRef names a per-service or per-endpoint chain without allocating:
// the name is its kind's prefix in a ChainNames followed by the hash.
type chainRef struct {
	kind chainKind
	hash chainHash
}

func (r chainRef) appendTo(b []byte, n *ChainNames) []byte {
	b = append(b, n.kinds[r.kind]...)
	return append(b, r.hash[:]...)
}

func (r chainRef) chain(n *ChainNames) Chain {
	return Chain(r.appendTo(make([]byte, 0, len(n.kinds[r.kind])+hashLen), n))
}

// parseRef recognises a chain name that a writer with these names could
// have made.
func (n *ChainNames) parseRef(name string) (chainRef, bool) {
	for k, p := range n.kinds {
		rest, ok := strings.CutPrefix(name, p)
		if !ok || len(rest) != hashLen {
			continue
		}
		var r chainRef
		r.kind = chainKind(k)
		copy(r.hash[:], rest)
		return r, true
	}
	return chainRef{}, false
}

// hashInto computes the hash of the bytes in key: the first 16 characters
// of the base32 encoding of their SHA-256, exactly as kube-proxy names its
// chains, so that names stay the same for users moving from kube-proxy.
// Those 16 characters encode the first 10 bytes of the sum.
func hashInto(key []byte) chainHash {
	sum := sha256.Sum256(key)
	var h chainHash
	base32.StdEncoding.Encode(h[:], sum[:10])
	return h
}

// appendPortKey appends what a service port's chain names hash: the port's
// name ("ns/name:port") and its protocol in lower case.
func appendPortKey(b []byte, name changetracker.ServicePortName) []byte {
	b = appendPortName(b, name)
	for i := 0; i < len(name.Protocol); i++ {
		c := name.Protocol[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	return b
}

func (n *ChainNames) portChain(kind chainKind, name changetracker.ServicePortName) Chain {
	return chainRef{kind: kind, hash: hashInto(appendPortKey(nil, name))}.chain(n)
}

// ServiceCluster returns the PREFIX-SVC-* chain of a service port (KUBE-SVC-*
// with kube-proxy's names): the chain that picks among all the port's usable
// endpoints. The name depends only on the prefix and the namespace, service
// name, port name and protocol, and with [DefaultChainNames] equals the one
// kube-proxy uses.
func (n *ChainNames) ServiceCluster(name changetracker.ServicePortName) Chain {
	return n.portChain(kindSVC, name)
}

// ServiceLocal returns the PREFIX-SVL-* chain of a service port: the chain
// that picks among the port's endpoints on this node. It is named like
// [ChainNames.ServiceCluster].
func (n *ChainNames) ServiceLocal(name changetracker.ServicePortName) Chain {
	return n.portChain(kindSVL, name)
}

// ServiceExternal returns the PREFIX-EXT-* chain of a service port, which
// handles traffic to its node port, external IPs and load-balancer VIPs. It
// is named like [ChainNames.ServiceCluster].
func (n *ChainNames) ServiceExternal(name changetracker.ServicePortName) Chain {
	return n.portChain(kindEXT, name)
}

// ServiceFirewall returns the PREFIX-FW-* chain of a service port, which lets
// load-balancer traffic through only from loadBalancerSourceRanges. It is
// named like [ChainNames.ServiceCluster].
func (n *ChainNames) ServiceFirewall(name changetracker.ServicePortName) Chain {
	return n.portChain(kindFW, name)
}

// Endpoint returns the PREFIX-SEP-* chain of one endpoint of a service port;
// endpoint is the endpoint's "ip:port" as Endpoint.String returns it
// ("[fd00::1]:80" for IPv6). Two service ports sharing an endpoint get
// different chains.
func (n *ChainNames) Endpoint(name changetracker.ServicePortName, endpoint string) Chain {
	key := append(appendPortKey(nil, name), endpoint...)
	return chainRef{kind: kindSEP, hash: hashInto(key)}.chain(n)
}

// IsServiceChain reports whether c has the form of a per-service or
// per-endpoint chain that a writer with these names makes: PREFIX-SVC-,
// -SVL-, -EXT-, -FW- or -SEP- followed by 16 characters. Top-level chains
// such as PREFIX-SERVICES are not, nor are another prefix's chains.
func (n *ChainNames) IsServiceChain(c Chain) bool {
	_, ok := n.parseRef(string(c))
	return ok
}
