package nftables

import (
	"crypto/sha256"
	"encoding/base32"
	"net/netip"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/changetracker"
)

// The prefixes of the per-service objects, kube-proxy's. Every
// per-service name holds a "/", which none of the fixed names do: that is
// how a full sync recognises a chain of the writer's that no service needs.
const (
	clusterChainPrefix  = "service-"
	localChainPrefix    = "local-"
	externalChainPrefix = "external-"
	endpointChainPrefix = "endpoint-"
	affinitySetPrefix   = "affinity-"
)

// The shared load-balancing chains of the data-map layout, one per kind
// and endpoint count K: sharedChainPrefix + kind + K. Their names hold no
// "/", unlike every per-service name.
const (
	sharedChainPrefix = "lb-"
	// lbInternal: cluster-IP traffic, masqueraded from outside the
	// cluster CIDR; the endpoints map keyed by destination.
	lbInternal = ""
	// lbExternal: external IPs and load-balancer IPs of a Cluster
	// policy, always masqueraded; keyed by destination.
	lbExternal = "external-"
	// lbNodePort: node ports of a Cluster policy, always masqueraded;
	// the node-port endpoints map keyed by protocol and port.
	lbNodePort = "nodeport-"
)

// sharedChain returns the shared chain of kind for k endpoints.
func sharedChain(kind string, k int) string {
	return sharedChainPrefix + kind + strconv.Itoa(k)
}

// isSharedChain reports whether name is one of sharedChain's names.
func isSharedChain(name string) bool {
	rest, ok := strings.CutPrefix(name, sharedChainPrefix)
	if !ok {
		return false
	}
	for _, kind := range []string{lbExternal, lbNodePort, lbInternal} {
		if n, ok := strings.CutPrefix(rest, kind); ok {
			k, err := strconv.Atoi(n)
			return err == nil && k > 0 && strconv.Itoa(k) == n
		}
	}
	return false
}

// maxPrefixLen is the room kept for the longest of those prefixes.
const maxPrefixLen = 16

// hashedName returns name led by the first 8 base32 characters of its
// SHA-256, cut to fit knftables.NameLengthMax after a prefix. The hash
// keeps a cut name unique and makes names that differ in one digit easy
// to tell apart; it is kube-proxy's scheme, so a reader of either table
// recognises the other's names.
func hashedName(name string) string {
	sum := sha256.Sum256([]byte(name))
	s := base32.StdEncoding.EncodeToString(sum[:])[:8] + "-" + name
	if max := knftables.NameLengthMax - maxPrefixLen; len(s) > max {
		s = s[:max-3] + "..."
	}
	return s
}

// portBase returns the hashed "ns/name/proto/port" that follows the
// prefix of a service port's chains.
func portBase(name changetracker.ServicePortName) string {
	return hashedName(name.Namespace + "/" + name.Name + "/" + protocolName(name.Protocol) + "/" + name.Port)
}

// endpointBase returns the hashed "ns/name/proto/port__ip/port" of an
// endpoint's chain and affinity set. An IPv6 address's colons, which a
// chain name cannot hold, become dots.
func endpointBase(name changetracker.ServicePortName, ip netip.Addr, port int) string {
	addr := ip.String()
	if ip.Is6() {
		addr = strings.ReplaceAll(addr, ":", ".")
	}
	return hashedName(name.Namespace + "/" + name.Name + "/" + protocolName(name.Protocol) + "/" + name.Port +
		"__" + addr + "/" + strconv.Itoa(port))
}

// isServiceObject reports whether a chain or set name is one of the
// per-service names above.
func isServiceObject(name string) bool { return strings.Contains(name, "/") }

// checkName reports why name cannot reach a transaction, or "" if it can.
// The parts of a service port's name go into chain names, set names and
// comments unquoted or inside knftables' %q, so each part must be what the
// API server accepts (a DNS label for the namespace, the name and the port
// name) and nothing more: lowercase letters, digits and inner '-'. The
// trackers check the same; this is the writer's own line, for a caller's
// MakeServicePortFunc or ServicePort implementation.
func checkName(name changetracker.ServicePortName) string {
	switch {
	case !isLabel(name.Namespace):
		return "namespace is not a DNS label"
	case !isLabel(name.Name):
		return "service name is not a DNS label"
	case name.Port != "" && !isLabel(name.Port):
		return "port name is not a DNS label"
	}
	return ""
}

func isLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// portComment returns the comment for a service port's elements,
// "ns/name:port", or nil when it would be longer than nft takes
// (knftables.CommentLengthMax); the chain names still say which port the
// objects belong to.
func portComment(name changetracker.ServicePortName) *string {
	s := name.String()
	if len(s) > knftables.CommentLengthMax {
		return nil
	}
	return &s
}
