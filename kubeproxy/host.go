package kubeproxy

import (
	"context"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/healthz"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/kernel"
	"github.com/proxykit/proxykit/nftables"
)

// Host is what a proxier takes from the machine it runs on. RealHost
// returns the machine's; a test, or a proxier working in another network
// namespace, replaces parts of it. Outside a dry run, New, InitNode and
// Cleanup call the fields their mode needs, so a Host made by hand sets
// them all; Conntrack, NewNFAcct, NFTTableLookup, HostAddresses and Listen
// may be nil, as their docs say. A dry run reads
// only HostAddresses and Listen (see WithDryRun).
type Host struct {
	// DetectBackend picks the iptables backend (legacy or nft) this node
	// uses; NewIPTables makes the Interface of one family for it.
	DetectBackend func(ctx context.Context) (iptables.Backend, error)
	NewIPTables   func(ctx context.Context, p v1.IPFamily, b iptables.Backend) (iptables.Interface, error)
	// NewNFAcct opens the node's nfacct counters, which iptables mode
	// counts INVALID drops and localhost node-port packets in, as
	// kube-proxy does (iptables.WithNFAcct); nil, or an error (a kernel
	// without nfacct), leaves them out, which is logged.
	NewNFAcct func() (iptables.NFAcct, error)
	// Conntrack clears stale flows after each sync; nil turns that off.
	Conntrack conntrack.Interface
	// Kernel reads and sets sysctls and modules.
	Kernel *kernel.Kernel
	// OpenIPVS opens IPVS mode's kernel side, with the IPVS table when
	// table is set (see ipvsmode.OpenHandles).
	OpenIPVS func(ctx context.Context, table bool) (*ipvsmode.Handles, error)
	// NewNFTables makes the knftables Interface of nftables mode's table
	// of one family.
	NewNFTables func(ctx context.Context, family knftables.Family, table string) (knftables.Interface, error)
	// NFTTableLookup, when set, is how nftables mode checks that its
	// table of one family still exists, instead of asking the kernel
	// over netlink.
	NFTTableLookup func(family knftables.Family, table string) nftables.TableLookup
	// OpenEBPF loads and attaches ebpf mode's programs of one family and
	// returns their maps (ebpf.Open); ebpf mode fails without it.
	OpenEBPF func(cfg ebpf.DatapathConfig) (ebpf.Maps, error)
	// CleanupEBPF removes what ebpf mode pinned with cfg (both families:
	// cfg.Family is ""), reporting whether there was anything
	// (ebpf.FindLeftovers, then ebpf.Cleanup); nil leaves ebpf mode's
	// state alone, in Cleanup and at the start of the other modes.
	CleanupEBPF func(cfg ebpf.DatapathConfig) (bool, error)
	// HostAddresses lists the node's addresses when no Node object gives
	// them; nil means proxier.HostAddresses.
	HostAddresses func() ([]netip.Addr, error)
	// Listen opens the listeners of the health and health-check servers;
	// nil means net.ListenConfig's.
	Listen healthz.ListenFunc
}
