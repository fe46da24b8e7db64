package iptables

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"

	"github.com/proxykit/proxykit/changetracker"
)

// The top-level chains of the service rules, named as kube-proxy names
// them. The writer fills them; built-in chains jump to them (see
// JumpRules).
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

// Prefixes of the per-service and per-endpoint chains. A hash of the
// service port (and endpoint) follows, so that names are stable across
// restarts and fit iptables' 28-character limit.
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

var chainPrefixes = [numChainKinds]string{
	kindSVC: ServiceClusterChainPrefix,
	kindSVL: ServiceLocalChainPrefix,
	kindEXT: ServiceExternalChainPrefix,
	kindFW:  ServiceFirewallChainPrefix,
	kindSEP: EndpointChainPrefix,
}

// chainHash is the hash part of a per-service or per-endpoint chain name.
type chainHash [hashLen]byte

// chainRef names a per-service or per-endpoint chain without allocating:
// the name is its kind's prefix followed by the hash.
type chainRef struct {
	kind chainKind
	hash chainHash
}

func (r chainRef) appendTo(b []byte) []byte {
	b = append(b, chainPrefixes[r.kind]...)
	return append(b, r.hash[:]...)
}

func (r chainRef) chain() Chain { return Chain(r.appendTo(make([]byte, 0, 25))) }

// parseChainRef recognises a chain name that the writer could have made.
func parseChainRef(name string) (chainRef, bool) {
	for k, p := range chainPrefixes {
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

func portChain(kind chainKind, name changetracker.ServicePortName) Chain {
	return chainRef{kind: kind, hash: hashInto(appendPortKey(nil, name))}.chain()
}

// ServiceClusterChain returns the KUBE-SVC-* chain of a service port: the
// chain that picks among all the port's usable endpoints. The name depends
// only on the namespace, service name, port name and protocol, and equals
// the one kube-proxy uses.
func ServiceClusterChain(name changetracker.ServicePortName) Chain {
	return portChain(kindSVC, name)
}

// ServiceLocalChain returns the KUBE-SVL-* chain of a service port: the
// chain that picks among the port's endpoints on this node. It is named
// like [ServiceClusterChain].
func ServiceLocalChain(name changetracker.ServicePortName) Chain {
	return portChain(kindSVL, name)
}

// ServiceExternalChain returns the KUBE-EXT-* chain of a service port,
// which handles traffic to its node port, external IPs and load-balancer
// VIPs. It is named like [ServiceClusterChain].
func ServiceExternalChain(name changetracker.ServicePortName) Chain {
	return portChain(kindEXT, name)
}

// ServiceFirewallChain returns the KUBE-FW-* chain of a service port,
// which lets load-balancer traffic through only from
// loadBalancerSourceRanges. It is named like [ServiceClusterChain].
func ServiceFirewallChain(name changetracker.ServicePortName) Chain {
	return portChain(kindFW, name)
}

// EndpointChain returns the KUBE-SEP-* chain of one endpoint of a service
// port; endpoint is the endpoint's "ip:port" as Endpoint.String returns it
// ("[fd00::1]:80" for IPv6). Two service ports sharing an endpoint get
// different chains.
func EndpointChain(name changetracker.ServicePortName, endpoint string) Chain {
	key := append(appendPortKey(nil, name), endpoint...)
	return chainRef{kind: kindSEP, hash: hashInto(key)}.chain()
}

// IsServiceChain reports whether c has the form of a per-service or
// per-endpoint chain that the writer makes: one of the KUBE-SVC-,
// KUBE-SVL-, KUBE-EXT-, KUBE-FW- or KUBE-SEP- prefixes followed by 16
// characters. Top-level chains such as KUBE-SERVICES are not.
func IsServiceChain(c Chain) bool {
	_, ok := parseChainRef(string(c))
	return ok
}
