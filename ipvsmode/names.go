package ipvsmode

import (
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/iptables"
)

// Names names what IPVS mode owns in iptables and ipset for one chain
// prefix: the chains it shares with the iptables rule writer
// (iptables.ChainNames: PREFIX-SERVICES, PREFIX-MARK-MASQ, ...), its own
// PREFIX-NODE-PORT, PREFIX-LOAD-BALANCER, PREFIX-SOURCE-RANGES-FIREWALL and
// PREFIX-IPVS-FILTER, and the ipsets PREFIX-CLUSTER-IP and so on
// (PREFIX-6-CLUSTER-IP for IPv6). With iptables.DefaultChainPrefix every
// name is kube-proxy's. Two proxies with different prefixes own disjoint
// chains and sets.
//
// The virtual servers and the dummy interface are not named by the
// prefix: give a second IPVS-mode proxy its own with the Reconciler's
// WithExcludeCIDRs and WithDummyDevice.
//
// A Names is immutable and safe for concurrent use.
type Names struct {
	chains                                           *iptables.ChainNames
	nodePort, loadBalancer, sourceRanges, ipvsFilter iptables.Chain
	// declared are the chains the payload declares, in the order it
	// declares them.
	declared []tableChain
	// decls are the payload's chain declarations (":CHAIN"), per table.
	decls     map[iptables.Table][]string
	setPrefix string
}

// NewNames returns IPVS mode's names for prefix; "" means
// iptables.DefaultChainPrefix. It refuses what iptables.NewChainNames
// refuses, and a prefix longer than 5 characters, which would make
// PREFIX-SOURCE-RANGES-FIREWALL longer than iptables' 28 characters.
func NewNames(prefix string) (*Names, error) {
	chains, err := iptables.NewChainNames(prefix)
	if err != nil {
		return nil, fmt.Errorf("IPVS mode: %w", err)
	}
	n := &Names{
		chains:       chains,
		nodePort:     chains.Custom("NODE-PORT"),
		loadBalancer: chains.Custom("LOAD-BALANCER"),
		sourceRanges: chains.Custom("SOURCE-RANGES-FIREWALL"),
		ipvsFilter:   chains.Custom("IPVS-FILTER"),
		setPrefix:    chains.Prefix() + "-",
	}
	if len(n.sourceRanges) > 28 {
		return nil, fmt.Errorf("IPVS mode: chain prefix %q: chain %s is longer than iptables' 28 characters", chains.Prefix(), n.sourceRanges)
	}
	n.declared = []tableChain{
		{iptables.TableNAT, chains.Services()},
		{iptables.TableNAT, chains.Postrouting()},
		{iptables.TableNAT, n.nodePort},
		{iptables.TableNAT, n.loadBalancer},
		{iptables.TableNAT, chains.MarkMasq()},
		{iptables.TableFilter, chains.Forward()},
		{iptables.TableFilter, n.nodePort},
		{iptables.TableFilter, chains.ProxyFirewall()},
		{iptables.TableFilter, n.sourceRanges},
		{iptables.TableFilter, n.ipvsFilter},
	}
	n.decls = map[iptables.Table][]string{}
	for _, tc := range n.declared {
		n.decls[tc.table] = append(n.decls[tc.table], ":"+string(tc.chain))
	}
	return n, nil
}

// defaultModeNames are kube-proxy's names (DefaultNames).
var defaultModeNames = func() *Names {
	n, err := NewNames(iptables.DefaultChainPrefix)
	if err != nil {
		panic(err)
	}
	return n
}()

// Chains returns the names IPVS mode shares with the iptables rule writer
// of the same prefix.
func (n *Names) Chains() *iptables.ChainNames { return n.chains }

// SetPrefix returns what every ipset name of IPVS mode starts with,
// "PREFIX-": give it to ipset.NewReconciler, which then owns those sets
// and no other proxy's.
func (n *Names) SetPrefix() string { return n.setPrefix }

// IsModeChain is the package's [Names.IsModeChain] for these names.
func (n *Names) IsModeChain(t iptables.Table, c iptables.Chain) bool {
	return slices.Contains(n.declared, tableChain{t, c})
}

// setName returns the name of set k in family. IPv6 sets start with
// "PREFIX-6-" instead of "PREFIX-", cut to the kernel's 31 bytes, as
// kube-proxy names them, so that both families' sets coexist on a
// dual-stack node. With at most 5 characters of prefix (NewNames
// refuses more) the cut names stay distinct: the longest pairs sharing a
// start, LOAD-BALANCER-SOURCE-IP and -CIDR, differ by the 30th byte.
func (n *Names) setName(k setKind, family v1.IPFamily) string {
	rest := strings.TrimPrefix(setDefs[k].name, SetPrefix)
	name := n.setPrefix + rest
	if family == v1.IPv6Protocol {
		name = n.setPrefix + "6-" + rest
	}
	if len(name) > ipset.MaxNameLen {
		name = name[:ipset.MaxNameLen]
	}
	return name
}

// DefaultNames returns IPVS mode's names with kube-proxy's prefix. The
// Names are shared and never change.
func DefaultNames() *Names { return defaultModeNames }
