package ipvsmode

import (
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipset"
)

// SetPrefix starts the name of every ipset IPVS mode uses, in both
// families, with iptables.DefaultChainPrefix (see [Names.SetPrefix]
// for another). Give it to ipset.NewReconciler: the reconciler then owns
// every set whose name starts with it, which is also what [Cleanup]
// destroys.
const SetPrefix = "KUBE-"

// setKind is one of the ipsets of IPVS mode; its index into
// SyncResult.Sets.
type setKind uint8

const (
	setLoopBack setKind = iota
	setClusterIP
	setExternalIP
	setExternalIPLocal
	setLoadBalancer
	setLoadBalancerLocal
	setLoadBalancerFW
	setLoadBalancerSourceIP
	setLoadBalancerSourceCIDR
	setNodePortTCP
	setNodePortLocalTCP
	setNodePortUDP
	setNodePortLocalUDP
	setNodePortSCTP
	setNodePortLocalSCTP
	setHealthCheckNodePort
	setIPVSIPs
	numSets
)

// setDefs are the IPv4 names and the types of the sets, as kube-proxy
// names them, so that a node moving between kube-proxy and a proxier built
// on this package keeps one set of each.
var setDefs = [numSets]struct {
	name string
	typ  ipset.Type
}{
	setLoopBack:               {"KUBE-LOOP-BACK", ipset.HashIPPortIP},
	setClusterIP:              {"KUBE-CLUSTER-IP", ipset.HashIPPort},
	setExternalIP:             {"KUBE-EXTERNAL-IP", ipset.HashIPPort},
	setExternalIPLocal:        {"KUBE-EXTERNAL-IP-LOCAL", ipset.HashIPPort},
	setLoadBalancer:           {"KUBE-LOAD-BALANCER", ipset.HashIPPort},
	setLoadBalancerLocal:      {"KUBE-LOAD-BALANCER-LOCAL", ipset.HashIPPort},
	setLoadBalancerFW:         {"KUBE-LOAD-BALANCER-FW", ipset.HashIPPort},
	setLoadBalancerSourceIP:   {"KUBE-LOAD-BALANCER-SOURCE-IP", ipset.HashIPPortIP},
	setLoadBalancerSourceCIDR: {"KUBE-LOAD-BALANCER-SOURCE-CIDR", ipset.HashIPPortNet},
	setNodePortTCP:            {"KUBE-NODE-PORT-TCP", ipset.BitmapPort},
	setNodePortLocalTCP:       {"KUBE-NODE-PORT-LOCAL-TCP", ipset.BitmapPort},
	setNodePortUDP:            {"KUBE-NODE-PORT-UDP", ipset.BitmapPort},
	setNodePortLocalUDP:       {"KUBE-NODE-PORT-LOCAL-UDP", ipset.BitmapPort},
	// SCTP node ports are matched with the node address, in a hash: the
	// kernel's bitmap:port cannot tell SCTP from TCP.
	setNodePortSCTP:        {"KUBE-NODE-PORT-SCTP-HASH", ipset.HashIPPort},
	setNodePortLocalSCTP:   {"KUBE-NODE-PORT-LOCAL-SCTP-HASH", ipset.HashIPPort},
	setHealthCheckNodePort: {"KUBE-HEALTH-CHECK-NODE-PORT", ipset.BitmapPort},
	setIPVSIPs:             {"KUBE-IPVS-IPS", ipset.HashIP},
}

// setDesc returns the description of set k, named name, in family, with
// the kernel's defaults except a maximum large enough for n members.
func setDesc(k setKind, name string, family v1.IPFamily, n int) ipset.Set {
	s := ipset.Set{Name: name, Type: setDefs[k].typ}
	if !s.Type.IsHash() {
		return s
	}
	s.Family = ipset.FamilyIPv4
	if family == v1.IPv6Protocol {
		s.Family = ipset.FamilyIPv6
	}
	// The kernel refuses members beyond the maximum; raise it (by powers
	// of two, so that it changes, and the set is swapped, rarely) only
	// when the default is too small.
	if n > ipset.DefaultMaxElem {
		limit := uint32(ipset.DefaultMaxElem)
		for int(limit) < n {
			limit *= 2
		}
		s.MaxElem = limit
	}
	return s
}
