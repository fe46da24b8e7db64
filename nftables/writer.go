package nftables

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/logsafe"
	"github.com/proxykit/proxykit/portcheck"
	"github.com/proxykit/proxykit/proxy"
)

// DefaultTableName is the table a Writer owns when WriterConfig.TableName
// is empty: kube-proxy's.
const DefaultTableName = "kube-proxy"

// The fixed objects of the table, kube-proxy's names.
const (
	filterPreroutingPreDNATChain = "filter-prerouting-pre-dnat"
	filterOutputPreDNATChain     = "filter-output-pre-dnat"
	filterInputChain             = "filter-input"
	filterForwardChain           = "filter-forward"
	filterOutputChain            = "filter-output"
	natPreroutingChain           = "nat-prerouting"
	natOutputChain               = "nat-output"
	natPostroutingChain          = "nat-postrouting"

	servicesChain               = "services"
	serviceEndpointsCheckChain  = "service-endpoints-check"
	nodePortEndpointsCheckChain = "nodeport-endpoints-check"
	firewallCheckChain          = "firewall-check"
	clusterIPsCheckChain        = "cluster-ips-check"
	rejectChain                 = "reject-chain"
	markMasqChain               = "mark-for-masquerade"
	masqueradingChain           = "masquerading"

	serviceIPsMap          = "service-ips"
	serviceNodePortsMap    = "service-nodeports"
	noEndpointServicesMap  = "no-endpoint-services"
	noEndpointNodePortsMap = "no-endpoint-nodeports"
	firewallIPsSet         = "firewall-ips"
	firewallAllowSet       = "firewall-allow"
	clusterIPsSet          = "cluster-ips"
	nodePortIPsSet         = "nodeport-ips"

	// The data-map layout's objects: endpoints by service key and index,
	// endpoints by node port and index, and this node's endpoints as
	// "ep . ep" for the hairpin masquerade.
	endpointsMap         = "endpoints"
	nodePortEndpointsMap = "nodeport-endpoints"
	hairpinSet           = "hairpin-endpoints"
)

// WriterConfig configures a [Writer]. Only Family is required.
type WriterConfig struct {
	// Family is the family of the writer's table, v1.IPv4Protocol (nft
	// family "ip") or v1.IPv6Protocol ("ip6"); one writer per family.
	// Service ports whose cluster IP is of the other family are skipped,
	// and so are addresses of the other family in the other fields and in
	// Node.
	Family v1.IPFamily

	// TableName is the table the writer owns, whole; "" means
	// DefaultTableName. Give two proxies on one node different tables.
	// NewWriter refuses a name nft would not take as a bare word.
	TableName string

	// Node holds the settings every mode shares: the node's name for
	// topology, the node-port addresses, the pod network for local
	// traffic detection, and masquerading. The writer reads the prefixes
	// of its own family and ignores the others, so one NodeConfig serves
	// every family: node ports are served on every local address when no
	// NodePortAddresses prefix is of the writer's family, and ClusterCIDR
	// local-traffic detection is off when no ClusterCIDRs prefix is. Node
	// ports are never served on loopback addresses, as in kube-proxy's
	// nftables mode. Traffic to a cluster IP that is not local
	// (Node.LocalDetector: "ip saddr !=" the ClusterCIDRs prefix or the
	// NodeCIDR mode's pod range, `iifname != "cni0"`, or
	// `iifname != "veth*"`) is masqueraded, and local traffic to an
	// external address of an externalTrafficPolicy Local service is
	// short-circuited to all endpoints. NewWriter fails on a
	// DetectLocalMode or interface name Node.LocalDetector refuses.
	Node proxy.NodeConfig

	// ServiceCIDRs are the ranges cluster IPs are allocated from when a
	// sync's FamilyInput.ServiceCIDRs is empty: a default for a caller that
	// knows them statically (an API server that does not serve
	// ServiceCIDR objects). New connections to an address inside them
	// that no service has are dropped, as kube-proxy does; empty means
	// none are. Prefixes of the other family, or not valid, are ignored,
	// so one list may serve both families' writers.
	ServiceCIDRs []netip.Prefix

	// FullSyncPeriod, when positive, makes a sync a periodic resync if
	// the last resync is at least that old. Without KernelState the
	// resync is a full sync. With it, the writer first reads the
	// namespace's nf_tables generation: unchanged since its own last
	// transaction, the resync is skipped (the sync is partial); moved,
	// the writer compares the table with its memory and repairs what
	// differs in a partial sync, and only when that cannot be done
	// (SyncResult.Resync) is the sync full.
	FullSyncPeriod time.Duration

	// KernelState, when not nil, makes the periodic resync check the
	// kernel instead of rewriting the table (FullSyncPeriod). It must
	// read the network namespace that the Interface's transactions go
	// to; NewKernelState gives one, WatchKernel one that also follows
	// the namespace's commits (TableWatcher), so that others' commits to
	// other tables cost no comparison.
	KernelState KernelState

	// Clock is read for FullSyncPeriod; nil means the real clock.
	Clock clock.PassiveClock

	// SplitFirstLoad, when true, makes a full sync that finds no table
	// (the first on a node, or the first after Cleanup or after the table
	// was deleted) leave the additions of the elements that ApplyElements
	// can send out of the Transaction and return them in
	// SyncResult.Elements, so that the bulk of a large table reaches the
	// kernel through netlink instead of nft's parser (BENCHMARKS.md). The
	// two steps are not one atomic transaction, which is why only a load
	// into a missing table is split: until the elements arrive, the
	// services are unreachable, as they were before. Every other sync is
	// one transaction, as without it.
	SplitFirstLoad bool

	// NetlinkElementSyncs, when true, makes a partial sync whose every
	// change is a deletion or an addition of an element that
	// ApplyElementBatch can send (one without a comment, of endpoints,
	// nodeport-endpoints, service-ips, service-nodeports, cluster-ips,
	// hairpin-endpoints or firewall-ips) return them in
	// SyncResult.Batch, with an empty Transaction, so that the most
	// common change, endpoints coming and going, reaches the kernel as
	// one netlink batch without an exec of nft and its parser
	// (BENCHMARKS.md). The batch is atomic as the transaction would be.
	// A sync that changes anything else (a chain, a rule, an element with
	// a comment, an interval set) is one Transaction, whole, as without
	// it, and so is every full sync.
	NetlinkElementSyncs bool
}

// SyncResult is what [Writer.Sync] produced.
type SyncResult struct {
	// Full is true for a full sync.
	Full bool
	// Transaction brings the table to the desired state. Run it with the
	// Interface given to NewWriter (or print it with String for a dry
	// run) and report the outcome with Writer.Applied. A partial sync that
	// found nothing to change returns an empty transaction
	// (NumOperations 0), which need not be run (report Applied(nil)), and
	// so does one whose changes are in Batch instead. The
	// objects in it are shared with later transactions and must not be
	// changed.
	Transaction *knftables.Transaction
	// ServicePortsWritten counts the service ports whose objects are in
	// the transaction: all of them for a full sync, the changed ones
	// otherwise.
	ServicePortsWritten int
	// ChainsDeleted counts the chains the transaction deletes.
	ChainsDeleted int
	// ServicePorts and Endpoints count what the writer now programs.
	ServicePorts, Endpoints int
	// Elements, for a full sync split by WriterConfig.SplitFirstLoad,
	// are element additions left out of Transaction: run Transaction
	// first, then ApplyElements with these, and report the first error of
	// the two (or nil) to Writer.Applied. Nil otherwise.
	Elements []*knftables.Element
	// Batch, for a partial sync that NetlinkElementSyncs sends through
	// netlink, holds its changes, deletions first, and Transaction is
	// then empty: run ApplyElementBatch with it (where nft would run)
	// and report its error (or nil) to Writer.Applied. Nil otherwise.
	// Its elements are shared as the transaction's objects are.
	Batch *ElementBatch
	// Resync says what the sync did about a periodic resync that was due.
	Resync Resync
	// Drifted counts the elements and chains that a ResyncChecked sync
	// found changed behind the writer and repairs.
	Drifted int
	// NoLocalEndpointsInternal and NoLocalEndpointsExternal count the
	// service ports whose internal (external) traffic policy is Local and
	// whose traffic is dropped because this node has no endpoint for them,
	// while other nodes do (kube-proxy's
	// sync_proxy_rules_no_local_endpoints_total).
	NoLocalEndpointsInternal, NoLocalEndpointsExternal int
}

// Writer renders service rules for one nftables table, one IP family, as
// knftables transactions. It keeps what it wrote last, so that a partial
// sync holds only the objects of the services that changed, and a full
// sync deletes what nothing needs any more. It runs nothing itself except
// one listing of the table's chains and sets on the first full sync (and
// the first after a failure), and the reads of WriterConfig.KernelState
// (in Sync and Applied): the caller runs the transaction and reports the
// outcome with Applied.
//
// A Writer is not safe for concurrent use, except RequestFullSync, which
// may be called from any goroutine.
type Writer struct {
	nft          knftables.Interface
	cfg          WriterConfig
	check        portcheck.Checker
	nodeIPs      []netip.Addr // FamilyInput.NodeIPs of the last Sync
	family       knftables.Family
	table        string
	ipX          string // "ip" or "ip6"
	addrType     string // "ipv4_addr" or "ipv6_addr"
	loopback     string // "127.0.0.0/8" or "::1"
	mark         string
	matchAllNP   bool
	nodePortNets []netip.Prefix
	clock        clock.PassiveClock

	// local tells local traffic, as of the last Sync (see localDetector;
	// localKnown is false before the first); ifLocal and ifNotLocal are
	// its matches as rule text: IfLocalNFT's words, IfNotLocalNFT's
	// joined.
	local      proxy.LocalDetector
	localKnown bool
	ifLocal    []string
	ifNotLocal string

	requestFull atomic.Bool
	needFull    bool
	// needList says the next full sync must list the table, because the
	// writer does not know what it holds: at the start, and after a
	// transaction that may not have been applied.
	needList bool
	// split says this sync's element additions that ApplyElements can
	// send go to SyncResult.Elements (SplitFirstLoad, table missing).
	split bool
	// keepElems says this full sync does not flush the sets and maps
	// whose elements the writer tracks (all but firewall-allow and
	// nodeport-ips): it knows what the kernel holds, and sends only the
	// difference (see syncFull).
	keepElems  bool
	baseFresh  bool // the base chains were recreated once
	lastFull   time.Time
	nodeLabels map[string]string
	// serviceCIDRs are the merged ranges the cluster-ips-check chain
	// drops (or will once the sync being rendered is applied).
	serviceCIDRs []netip.Prefix
	unapplied    bool

	ports  map[types.NamespacedName][]*portState
	gen    uint64
	tables [numTables]*elemTable

	totalPorts, totalEndpoints int
	noLocalInt, noLocalExt     int
	chainsDeleted              int

	// The transaction is built in phases, emitted in this order, so that
	// every object exists before a rule refers to it, and nothing is
	// deleted while something still refers to it.
	elemDels  []op // map and set elements whose value changes or goes
	chainOps  []op // table, chains (add + flush), top-level maps and sets
	setOps    []op // affinity sets
	rules     []op
	elemAdds  []op
	finalDels []op // chains (flushed in chainOps) and sets

	names   []changetracker.ServicePortName
	changed []types.NamespacedName

	// epSlab is where newEPValue carves endpoint values from; gotos
	// holds the verdicts to the shared chains (gotoShared).
	epSlab   []epValue
	elemSlab []knftables.Element
	gotos    map[sharedKey]string
	// keyBuf is claimEndpoints' buffer for the keys it looks up.
	keyBuf []byte

	// sharedRefs counts, for each shared load-balancing chain, the
	// service-ips and service-nodeports elements that will point at it
	// once the transaction is applied; sharedWritten holds the shared
	// chains the kernel has (as far as the writer knows).
	sharedRefs    map[string]int
	sharedWritten map[string]bool

	// kernel, gt and ruleCounts serve the periodic resync: see KernelState
	// and genTrack. ruleCounts holds the number of rules the writer left
	// in each of its chains.
	kernel     KernelState
	gt         genTrack
	ruleCounts map[string]int
	drift      driftState
}

type tableID uint8

const (
	tClusterIPs tableID = iota
	tServiceIPs
	tServiceNodePorts
	tNoEndpointServices
	tNoEndpointNodePorts
	tFirewallIPs
	tFirewallAllow
	tEndpoints
	tNodePortEndpoints
	tHairpin
	numTables
)

type opVerb uint8

const (
	opAdd opVerb = iota
	opFlush
	opDelete
)

type op struct {
	verb opVerb
	obj  knftables.Object
}

// portState is what the writer last wrote for one service port.
type portState struct {
	name    changetracker.ServicePortName
	base    string  // hashed name part of its chains
	comment *string // "ns/name:port", nil if too long
	gen     uint64
	chains  []string
	sets    []affinitySet
	claims  []claimRef
	eps     map[netip.AddrPort]*epObjects // by endpoint

	endpoints int
	noLocal   uint8 // bit 0: internal, bit 1: external
	// order is, for the data-map layout, the endpoints at each index of
	// the endpoints maps: internal traffic's, then external traffic's.
	order [2][]netip.AddrPort
	// epValues are the endpoints' element values, kept between syncs
	// (findEPValue).
	epValues []*epValue
}

type affinitySet struct {
	name    string
	seconds int
}

// NewWriter returns a writer for cfg whose transactions are made by nft.
// nft must be an Interface for cfg's family and table (or for no table:
// the writer names its table in every object); a Fake made with
// knftables.NewFake works the same. It fails, naming the field, when the
// IP family is unknown, the table name is not a plain nft word, the
// masquerade bit is out of range, Node has two cluster CIDRs of the
// writer's family, or nft is for another table. The first Sync is full.
// cfg is copied; the writer never changes the caller's slices.
func NewWriter(nft knftables.Interface, cfg WriterConfig) (*Writer, error) {
	w := &Writer{
		nft:      nft,
		cfg:      cfg,
		table:    cfg.TableName,
		clock:    cfg.Clock,
		needFull: true,
		needList: true,
		ports:    make(map[types.NamespacedName][]*portState),

		sharedRefs:    make(map[string]int),
		sharedWritten: make(map[string]bool),
		kernel:        cfg.KernelState,
		ruleCounts:    make(map[string]int),
	}
	switch cfg.Family {
	case v1.IPv4Protocol:
		w.family, w.ipX, w.addrType, w.loopback = knftables.IPv4Family, "ip", "ipv4_addr", "127.0.0.0/8"
	case v1.IPv6Protocol:
		w.family, w.ipX, w.addrType, w.loopback = knftables.IPv6Family, "ip6", "ipv6_addr", "::1"
	default:
		return nil, fmt.Errorf("nftables writer: unknown IP family %q", cfg.Family)
	}
	w.check = portcheck.New(cfg.Family)
	if w.table == "" {
		w.table = DefaultTableName
	}
	if !isTableName(w.table) {
		return nil, fmt.Errorf("nftables writer: table name %q is not 1 to 64 letters, digits, '-' or '_' starting with a letter", w.table)
	}
	if w.clock == nil {
		w.clock = clock.RealClock{}
	}
	bit, err := cfg.Node.MasqueradeMark()
	if err != nil {
		return nil, fmt.Errorf("nftables writer: Node.MasqueradeBit: %w", err)
	}
	w.mark = fmt.Sprintf("%#08x", uint32(1)<<bit)
	if _, err := cfg.Node.LocalDetector(cfg.Family, nil); err != nil {
		return nil, fmt.Errorf("nftables writer: Node.%w", err)
	}
	w.cfg.ServiceCIDRs = nil
	for _, p := range cfg.ServiceCIDRs {
		if p.IsValid() && w.sameFamily(p.Addr()) {
			w.cfg.ServiceCIDRs = append(w.cfg.ServiceCIDRs, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked())
		}
	}
	w.nodePortNets = cfg.Node.NodePortPrefixes(cfg.Family)
	w.matchAllNP = len(w.nodePortNets) == 0
	if cfg.Node.NodePortPrimary {
		// The node's own addresses, which the inputs give: none before.
		w.nodePortNets, w.matchAllNP = nil, false
	}
	for _, p := range w.nodePortNets {
		if p.Bits() == 0 {
			w.matchAllNP = true
		}
	}
	if w.matchAllNP {
		w.nodePortNets = nil
	}
	// An Interface made for a table puts it in every object that does not
	// name one; one made for none ("", "") takes the writer's.
	probe := nft.NewTransaction()
	probe.Add(&knftables.Table{})
	if f := strings.Fields(probe.String()); len(f) == 4 && (knftables.Family(f[2]) != w.family || f[3] != w.table) {
		return nil, fmt.Errorf("nftables writer: the Interface is for table %s %s, not %s %s", f[2], f[3], w.family, w.table)
	}
	w.tables = [numTables]*elemTable{
		tClusterIPs:          newElemTable(clusterIPsSet, false),
		tServiceIPs:          newElemTable(serviceIPsMap, true),
		tServiceNodePorts:    newElemTable(serviceNodePortsMap, true),
		tNoEndpointServices:  newElemTable(noEndpointServicesMap, true),
		tNoEndpointNodePorts: newElemTable(noEndpointNodePortsMap, true),
		tFirewallIPs:         newElemTable(firewallIPsSet, false),
		tFirewallAllow:       newElemTable(firewallAllowSet, false),
		tEndpoints:           newElemTable(endpointsMap, true),
		tNodePortEndpoints:   newElemTable(nodePortEndpointsMap, true),
		tHairpin:             newElemTable(hairpinSet, false),
	}
	w.tables[tServiceIPs].counts = w.sharedRefs
	w.tables[tServiceNodePorts].counts = w.sharedRefs
	return w, nil
}

// isTableName reports whether s is a table name that needs no quoting in
// an nft command.
func isTableName(s string) bool {
	if len(s) == 0 || len(s) > 64 || !(s[0] >= 'a' && s[0] <= 'z' || s[0] >= 'A' && s[0] <= 'Z') {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

func (w *Writer) sameFamily(ip netip.Addr) bool {
	ip = ip.Unmap()
	return ip.IsValid() && ip.Is6() == (w.family == knftables.IPv6Family)
}

// Family returns the nft family of the writer's table, "ip" or "ip6".
func (w *Writer) Family() knftables.Family { return w.family }

// Table returns the name of the writer's table.
func (w *Writer) Table() string { return w.table }

// RequestFullSync makes the next Sync full: call it when another program
// may have changed the table. It is safe to call from any goroutine.
//
// A full sync rewrites every chain and rule, but sends only the set and
// map elements that differ from what the kernel holds. It knows what the
// kernel holds without reading it when WriterConfig.KernelState's
// generation says no one committed since the writer's last transaction,
// which the kernel took whole. Otherwise (no KernelState, another
// program's commit, or a failed transaction before) it reads them back
// through the Interface's ListElements, as kube-proxy's full sync does,
// and sends what repairs them: the missing and changed elements added,
// those it does not own deleted. When the table is missing (every
// listing not found) it loads everything, split as
// WriterConfig.SplitFirstLoad says if a listing of the table found it
// missing; when a listing fails otherwise, the sync flushes and fills
// the maps and sets as the first does. The interval sets firewall-allow
// and nodeport-ips are always flushed and filled.
//
// That full sync does not need the writer's memory of the table to be
// true: the chains and affinity sets it deletes because nothing needs
// them are added first (a no-op for one that exists), so a table that
// another program deleted, emptied or pruned since is repaired in one
// transaction the kernel takes. It does not list the table: nft reads
// the whole ruleset to list a table's chains and sets, which at scale
// costs more than rendering and applying the full sync together
// (BENCHMARKS.md). A chain or set that others added and
// nothing refers to therefore stays until a full sync that lists: the
// first, and the first after a failed transaction.
func (w *Writer) RequestFullSync() { w.requestFull.Store(true) }

// Applied reports the outcome of running the transaction of the last
// Sync: nil if it succeeded. After an error the next sync is full and
// lists the table first, since the writer's memory of it is then in
// doubt. A Sync whose outcome is never reported counts as failed. Calling
// Applied twice for one Sync, or before any Sync, does nothing.
func (w *Writer) Applied(err error) {
	if !w.unapplied {
		return
	}
	w.unapplied = false
	w.appliedGen(err)
	if err != nil {
		w.failed()
	}
}

func (w *Writer) failed() {
	w.gt.valid = false
	w.needFull = true
	w.needList = true
	// Recreate the base chains too: the transaction may have failed on
	// one left by another version.
	w.baseFresh = false
}

// Sync renders the transaction for in. The sync is full when one of these
// holds: it is the first, the last one failed or was never reported to
// Applied, RequestFullSync was called, in.Full is set, the node labels,
// the node's addresses of the writer's family or the service CIDRs
// (FamilyInput.ServiceCIDRs) changed, or
// FullSyncPeriod has passed since the last resync and the resync could
// not be done otherwise (see FullSyncPeriod and KernelState). Otherwise it
// is partial and holds only the objects of the services named in the
// change results, and what a periodic resync found drifted.
//
// Bad input is logged through the logger in ctx and skipped for that
// service port (or address, or endpoint) alone. An input whose Family is
// set and is not the writer's is logged, and its ports get no rules; an
// empty Family is read as the writer's. ctx also bounds the one listing a
// full sync may do.
func (w *Writer) Sync(ctx context.Context, in *proxy.FamilyInput) SyncResult {
	logger := klog.FromContext(ctx)
	if w.unapplied {
		logger.V(2).Info("Previous nftables transaction was never reported applied; syncing everything")
		w.failed()
	}
	full := w.needFull || w.requestFull.Swap(false) || in.Full
	if !maps.Equal(w.nodeLabels, in.NodeLabels) {
		full = true
		w.nodeLabels = maps.Clone(in.NodeLabels)
	}
	if in.Family != "" && in.Family != w.cfg.Family {
		logger.Error(nil, "Input of another IP family; its service ports get no rules", "ipFamily", w.cfg.Family, "inputFamily", logsafe.Quote(string(in.Family)), "table", w.table)
	}
	if ips := proxy.NodeIPsOf(w.cfg.Family, in.NodeIPs); !slices.Equal(ips, w.nodeIPs) {
		// A node address is matched in firewall rules and refused as a
		// cluster IP: every port is judged again.
		full = true
		w.nodeIPs = ips
		w.check = w.check.WithNodeIPs(ips)
		if w.cfg.Node.NodePortPrimary {
			// Node ports follow the node's addresses.
			w.nodePortNets, w.matchAllNP = proxy.HostPrefixes(ips), false
		}
	}
	if w.localDetector(logger, in.PodCIDRs) {
		// Masquerading and the short-circuit of pod traffic are in the
		// chains of every port and in the shared ones.
		full = true
	}
	if w.setServiceCIDRs(logger, in.ServiceCIDRs) {
		// Ports refused or programmed under the old ranges are judged
		// again: a full sync, which is rare (ServiceCIDR objects seldom
		// change) and rewrites cluster-ips-check too.
		full = true
	}
	w.check = w.check.WithServiceCIDRs(w.serviceCIDRs)
	for _, p := range []*[]op{&w.elemDels, &w.chainOps, &w.setOps, &w.rules, &w.elemAdds, &w.finalDels} {
		clear(*p)
		*p = (*p)[:0]
	}
	// Read before anything is rendered or run: see genTrack.
	unchanged, scope := w.readGen(logger)
	now := w.clock.Now()
	resync, drifted := ResyncNone, 0
	if w.resyncDue(now, full) {
		switch {
		case w.kernel == nil:
			full, resync = true, ResyncRewrite
		case unchanged:
			resync = ResyncSkipped
			w.lastFull = now
		default:
			var ok bool
			if drifted, ok = w.checkDrift(ctx, logger, scope); ok {
				resync = ResyncChecked
				w.lastFull = now
				unchanged = true
			} else {
				full, resync = true, ResyncRewrite
			}
		}
	}
	w.chainsDeleted = 0
	var written int
	if full {
		written = w.syncFull(ctx, logger, in, unchanged)
		w.lastFull = now
	} else {
		written = w.syncPartial(logger, in)
		if drifted > 0 {
			for _, t := range w.tables {
				t.diff(w, &w.elemDels, &w.elemAdds)
			}
		}
	}
	w.needFull = false
	w.unapplied = true
	w.countRules(full)
	// A full sync rewrites everything the writer owns, so the kernel
	// after it is what memory says whatever it held before.
	w.gt.vouch = full || unchanged

	tx := w.nft.NewTransaction()
	var split []*knftables.Element
	if w.split {
		// Nearly every addition goes there: room made once.
		split = make([]*knftables.Element, 0, len(w.elemAdds))
	}
	var batch *ElementBatch
	phases := [][]op{w.elemDels, w.chainOps, w.setOps, w.rules, w.elemAdds, w.finalDels}
	if !full && w.cfg.NetlinkElementSyncs {
		if batch = w.elementBatch(); batch != nil {
			phases = nil
		}
	}
	for _, phase := range phases {
		for _, o := range phase {
			switch o.verb {
			case opAdd:
				if el, ok := o.obj.(*knftables.Element); ok && w.split && netlinkElement(el) {
					split = append(split, el)
					continue
				}
				tx.Add(o.obj)
			case opFlush:
				tx.Flush(o.obj)
			case opDelete:
				tx.Delete(o.obj)
			}
		}
	}
	if len(split) == 0 {
		split = nil
	}
	w.split = false
	w.gt.batches = 0
	if tx.NumOperations() > 0 {
		w.gt.batches++
	}
	if len(split) > 0 || batch != nil {
		w.gt.batches++
	}
	res := SyncResult{
		Full:                     full,
		Resync:                   resync,
		Drifted:                  drifted,
		Transaction:              tx,
		Elements:                 split,
		Batch:                    batch,
		ServicePortsWritten:      written,
		ChainsDeleted:            w.chainsDeleted,
		ServicePorts:             w.totalPorts,
		Endpoints:                w.totalEndpoints,
		NoLocalEndpointsInternal: w.noLocalInt,
		NoLocalEndpointsExternal: w.noLocalExt,
	}
	netlinkElements := 0
	if batch != nil {
		netlinkElements = batch.Len()
	}
	logger.V(2).Info("Rendered nftables transaction", "ipFamily", w.cfg.Family, "table", w.table, "full", full,
		"servicePortsWritten", written, "operations", tx.NumOperations(), "netlinkElements", netlinkElements, "chainsDeleted", res.ChainsDeleted, "resync", resync, "drifted", drifted,
		"servicePorts", res.ServicePorts, "endpoints", res.Endpoints)
	return res
}

// elementBatch returns the rendered partial sync as an ElementBatch when
// it is only deletions and additions of elements that ApplyElementBatch
// sends (NetlinkElementSyncs), and nil when anything else is in it, or
// nothing is. The deletions come first, as in the transaction, so that an
// element whose value changes is deleted before it is added again.
func (w *Writer) elementBatch() *ElementBatch {
	if len(w.chainOps)+len(w.setOps)+len(w.rules)+len(w.finalDels) > 0 || len(w.elemDels)+len(w.elemAdds) == 0 {
		return nil
	}
	b := &ElementBatch{Delete: make([]*knftables.Element, 0, len(w.elemDels)), Add: make([]*knftables.Element, 0, len(w.elemAdds))}
	for _, part := range []struct {
		ops  []op
		verb opVerb
		to   *[]*knftables.Element
	}{{w.elemDels, opDelete, &b.Delete}, {w.elemAdds, opAdd, &b.Add}} {
		for _, o := range part.ops {
			el, ok := o.obj.(*knftables.Element)
			if !ok || o.verb != part.verb || !netlinkElement(el) {
				return nil
			}
			*part.to = append(*part.to, el)
		}
	}
	return b
}

// syncFull renders everything the writer owns and returns how many
// service ports it wrote.
//
// The top-level chains are flushed and filled again, in one atomic
// transaction, so whatever drifted (a rule deleted by hand) is repaired;
// the elements of the maps and sets are compared with what the kernel
// holds, and only the difference is sent (knowElements), unless the
// kernel's holdings are unknown, when they are flushed and filled too. Per-service chains are flushed and rewritten; those
// no service needs are deleted. To know those, the writer trusts its
// memory, except on the first full sync and the first after a failed
// transaction: then it lists the table's chains and sets once (one nft
// call, whose cost grows with the table), since chains left by a previous
// run, or by a transaction whose outcome is unknown, are in no memory.
// Trusting memory to name what to delete does not make the transaction
// depend on it being true: deleteChain and deleteSet add what they delete
// first, so one that another program removed is no error.
func (w *Writer) syncFull(ctx context.Context, logger klog.Logger, in *proxy.FamilyInput, unchanged bool) int {
	// listed, from a listing, holds the per-service chains (true) and
	// sets (false) in the table; without one, each port's memory says
	// what it has.
	var listed map[string]bool
	absent := false
	if w.needList {
		listed, absent = w.listServiceObjects(ctx, logger)
		w.split = absent && w.cfg.SplitFirstLoad
	}
	w.needList = false
	w.keepElems = !absent && w.knowElements(ctx, logger, unchanged)

	w.gen++
	w.names = w.names[:0]
	total := 0
	for name, svc := range in.Services {
		if !w.usable(logger, name, svc) {
			continue
		}
		w.names = append(w.names, name)
		total += len(in.Endpoints[name])
	}
	slices.SortFunc(w.names, changetracker.CompareServicePortNames)
	w.totalEndpoints = total
	w.totalPorts = len(w.names)
	w.noLocalInt, w.noLocalExt = 0, 0

	w.writeStatic()
	for _, t := range w.tables {
		if w.keepElems && t.name != firewallAllowSet {
			t.reclaimAll()
		} else {
			t.reset()
		}
	}
	// The maps grow with the services and endpoints: sized once, not
	// grown from empty by the first full sync.
	w.tables[tClusterIPs].presize(len(w.names))
	w.tables[tServiceIPs].presize(len(w.names))
	w.tables[tEndpoints].presize(total)
	old := w.ports
	// Room for every Service at once (a Service has at least one of
	// the ports), not grown from empty by the first full sync.
	w.ports = make(map[types.NamespacedName][]*portState, max(len(old), len(w.names)))
	for _, ports := range old {
		for _, ps := range ports {
			ps.claims = ps.claims[:0]
		}
	}
	var desired map[string]bool
	if listed != nil {
		desired = make(map[string]bool, 4*len(w.names))
	}
	for _, name := range w.names {
		ps := portOrNew(old[name.NamespacedName], name)
		prevChains, prevSets := ps.chains, ps.sets
		ps.chains, ps.sets = nil, nil
		ps.gen = w.gen
		w.ports[name.NamespacedName] = append(w.ports[name.NamespacedName], ps)
		w.renderPort(logger, ps, in.Services[name], in.Endpoints[name], nil, prevSets, true, listed)
		ps.endpoints = len(in.Endpoints[name])
		w.countNoLocal(ps, +1)
		if desired == nil {
			w.dropStale(ps, prevChains, prevSets)
			continue
		}
		for _, c := range ps.chains {
			desired[c] = true
		}
		for _, s := range ps.sets {
			desired[s.name] = true
		}
	}
	dirty := 0
	for _, t := range w.tables {
		dirty += len(t.dirty)
	}
	// At most one addition per dirty entry: room made once.
	w.elemAdds = slices.Grow(w.elemAdds, dirty)
	for _, t := range w.tables {
		t.diff(w, &w.elemDels, &w.elemAdds)
	}
	w.writeSharedChains(true, desired)
	// What nothing needs: chains are flushed first (a rule of one may
	// jump to another, or use an affinity set) and deleted last.
	if desired == nil {
		var gone []*portState
		for _, ports := range old {
			for _, ps := range ports {
				if ps.gen != w.gen {
					gone = append(gone, ps)
				}
			}
		}
		slices.SortFunc(gone, func(a, b *portState) int { return changetracker.CompareServicePortNames(a.name, b.name) })
		for _, ps := range gone {
			w.dropStale(ps, ps.chains, ps.sets)
		}
	} else {
		var stale []string
		for name := range listed {
			if !desired[name] {
				stale = append(stale, name)
			}
		}
		slices.Sort(stale)
		for _, name := range stale {
			if listed[name] {
				w.deleteChain(name)
			} else {
				w.deleteSet(name, -1)
			}
		}
	}
	return len(w.names)
}

// knowElements reports whether the writer knows the elements the kernel
// holds in the sets and maps it tracks, so that a full sync may send only
// the difference instead of flushing and filling them again. It does when
// unchanged (the nf_tables generation says no one committed since the
// writer's last transaction, which the kernel took whole: the kernel holds
// what the writer's memory says), and otherwise reads them back: each set
// and map listed through the Interface (nft --json list, as kube-proxy's
// full sync does), the writer's memory of it replaced by what the kernel
// holds. A set or map the kernel does not have holds nothing. It reports
// false, and the sync flushes and fills them, when a listing fails
// otherwise, or the table is gone (every listing not found): there is
// nothing to keep, and a full load is cheaper than the diff.
func (w *Writer) knowElements(ctx context.Context, logger klog.Logger, unchanged bool) bool {
	if unchanged {
		return true
	}
	found, changed := false, 0
	for _, t := range w.tables {
		if t.name == firewallAllowSet {
			continue
		}
		kind := "set"
		if t.isMap {
			kind = "map"
		}
		els, err := w.nft.ListElements(ctx, kind, t.name)
		switch {
		case err == nil:
			found = true
		case knftables.IsNotFound(err):
		default:
			logger.Error(err, "Listing an nftables set failed; the full sync rewrites every element", "table", w.table, "ipFamily", w.cfg.Family, "set", t.name)
			return false
		}
		changed += t.readBack(els)
	}
	if changed > 0 {
		logger.V(2).Info("The nftables table's elements differ from the writer's memory; the full sync repairs them", "table", w.table, "ipFamily", w.cfg.Family, "elements", changed)
	}
	return found
}

// listServiceObjects lists the per-service chains (true) and affinity sets
// (false) in the table. A missing table holds nothing; another error is
// logged, and the sync then deletes only what the writer remembers.
func (w *Writer) listServiceObjects(ctx context.Context, logger klog.Logger) (found map[string]bool, absent bool) {
	found = make(map[string]bool)
	for _, kind := range []string{"chain", "set"} {
		names, err := w.nft.List(ctx, kind)
		if err != nil {
			if knftables.IsNotFound(err) {
				absent = true
			} else {
				logger.Error(err, "Listing the nftables table failed; objects left by an earlier run stay until a later full sync", "table", w.table, "ipFamily", w.cfg.Family, "objectType", kind)
			}
			continue
		}
		for _, n := range names {
			if isServiceObject(n) || kind == "chain" && isSharedChain(n) {
				found[n] = kind == "chain"
			}
		}
	}
	return found, absent
}

// deleteChain flushes a chain of the writer's early in the transaction
// and deletes it at the end: by then the map elements and rules that
// referred to it are gone (deleted, flushed or rewritten earlier in the
// same transaction). The chain is added first, which changes nothing if
// it exists: the writer deletes what its memory holds, and another
// program may have deleted the chain (or the whole table, before a
// requested full sync) since; without the add, the kernel would refuse
// the flush of a missing chain and with it the whole transaction.
//
// kube-proxy defers such deletions to a later sync: on kernels before 6.2
// (it says) a chain stayed referenced for a moment after the map element
// that pointed at it was deleted, so deleting the chain in the same
// transaction failed with EBUSY. Current kernels drop the reference when
// the deletion is prepared, in transaction order (the fix that made
// element and chain references transactional, around 6.4 and in the stable
// branches), so one transaction is correct, atomic, and leaves no stale
// chain behind. On a kernel without the fix the transaction fails and
// says so; the writer does not work around it.
func (w *Writer) deleteChain(name string) {
	c := &knftables.Chain{Family: w.family, Table: w.table, Name: name}
	w.chainOps = append(w.chainOps, op{opAdd, c}, op{opFlush, c})
	w.finalDels = append(w.finalDels, op{opDelete, c})
	w.chainsDeleted++
}

// syncPartial renders the service ports of the changed services and
// returns how many it wrote.
func (w *Writer) syncPartial(logger klog.Logger, in *proxy.FamilyInput) int {
	svcChanged := in.ServiceChanges.UpdatedServices
	w.changed = changetracker.ChangedServices(w.changed, in.ServiceChanges, in.EndpointChanges)
	if len(w.changed) == 0 {
		return 0
	}

	// The ports a changed service has now: those written last time when
	// only its endpoints changed (its ports in the map change only with
	// the Service, so those are all of its usable ones, none for a
	// service without), otherwise what the Update that changed it said.
	svcPorts := in.ServiceChanges.PortsIn(in.Services)

	written := 0
	for _, nn := range w.changed {
		old := w.ports[nn]
		w.names = w.names[:0]
		if svcChanged.Has(nn) {
			w.names = append(w.names, svcPorts[nn]...)
		} else {
			for _, ps := range old {
				w.names = append(w.names, ps.name)
			}
		}
		for _, ps := range old {
			w.totalEndpoints -= ps.endpoints
			w.totalPorts--
			w.countNoLocal(ps, -1)
		}
		w.gen++
		var kept []*portState
		for _, name := range w.names {
			if !w.usable(logger, name, in.Services[name]) {
				continue
			}
			ps := portOrNew(old, name)
			ps.gen = w.gen
			prevChains, prevSets := slices.Clone(ps.chains), slices.Clone(ps.sets)
			ps.chains, ps.sets = ps.chains[:0], ps.sets[:0]
			w.renderPort(logger, ps, in.Services[name], in.Endpoints[name], prevChains, prevSets, false, nil)
			w.dropStale(ps, prevChains, prevSets)
			ps.endpoints = len(in.Endpoints[name])
			w.totalEndpoints += ps.endpoints
			w.totalPorts++
			w.countNoLocal(ps, +1)
			kept = append(kept, ps)
			written++
		}
		for _, ps := range old {
			if ps.gen != w.gen {
				w.dropStale(ps, ps.chains, ps.sets)
				// No claim has a future generation: all go.
				releaseStale(ps, w.gen+1)
			}
		}
		if len(kept) == 0 {
			delete(w.ports, nn)
		} else {
			w.ports[nn] = kept
		}
	}
	for _, t := range w.tables {
		t.diff(w, &w.elemDels, &w.elemAdds)
	}
	w.writeSharedChains(false, nil)
	return written
}

// dropStale deletes the chains and sets of prev that ps no longer has
// (all of them if ps was not rendered in this sync). Unless they are equal
// it sorts ps.chains and prevChains, whose order means nothing, to compare
// them in one pass.
func (w *Writer) dropStale(ps *portState, prevChains []string, prevSets []affinitySet) {
	if ps.gen != w.gen {
		for _, c := range prevChains {
			w.deleteChain(c)
		}
		for _, s := range prevSets {
			w.deleteSet(s.name, s.seconds)
		}
		return
	}
	// The steady state writes the same chains in the same order.
	if !slices.Equal(ps.chains, prevChains) {
		slices.Sort(ps.chains)
		slices.Sort(prevChains)
		i := 0
		for _, c := range prevChains {
			for i < len(ps.chains) && ps.chains[i] < c {
				i++
			}
			if i == len(ps.chains) || ps.chains[i] != c {
				w.deleteChain(c)
			}
		}
	}
	for _, s := range prevSets {
		if !slices.ContainsFunc(ps.sets, func(n affinitySet) bool { return n.name == s.name }) {
			w.deleteSet(s.name, s.seconds)
		}
	}
}

// deleteSet deletes an affinity set at the end of the transaction, after
// the chains whose rules use it. A set the writer remembers (seconds, its
// timeout, is not negative) is added first, as it wrote it, for the reason
// deleteChain adds a chain: another program may have deleted it. One found
// by listing the table (seconds negative) exists, with a timeout the
// writer does not know.
func (w *Writer) deleteSet(name string, seconds int) {
	if seconds >= 0 {
		w.setOps = append(w.setOps, op{opAdd, w.affinitySetObject(name, seconds)})
	}
	w.finalDels = append(w.finalDels, op{opDelete, &knftables.Set{Family: w.family, Table: w.table, Name: name}})
}

// portOrNew returns the state of name among ports, the ports of one
// Service written before, or a new one when they do not hold it.
func portOrNew(ports []*portState, name changetracker.ServicePortName) *portState {
	for _, ps := range ports {
		if ps.name == name {
			return ps
		}
	}
	return newPortState(name)
}

func newPortState(name changetracker.ServicePortName) *portState {
	return &portState{name: name, base: portBase(name), comment: portComment(name)}
}

func (w *Writer) countNoLocal(ps *portState, sign int) {
	if ps.noLocal&1 != 0 {
		w.noLocalInt += sign
	}
	if ps.noLocal&2 != 0 {
		w.noLocalExt += sign
	}
}

// writeStatic queues the table and the objects that do not depend on
// services: base chains, top-level chains and their rules, and the
// (flushed) top-level maps and sets.
func (w *Writer) writeStatic() {
	w.add(&w.chainOps, &knftables.Table{Family: w.family, Name: w.table, Comment: ptr.To("service rules written by proxykit")})
	if !w.baseFresh {
		// A base chain's hook and priority cannot be changed by "add":
		// chains left by another version are recreated once.
		for _, bc := range baseChains {
			c := &knftables.Chain{Family: w.family, Table: w.table, Name: bc.name}
			w.add(&w.chainOps, c)
			w.chainOps = append(w.chainOps, op{opFlush, c}, op{opDelete, c})
		}
		for _, name := range retiredBaseChains {
			c := &knftables.Chain{Family: w.family, Table: w.table, Name: name}
			w.add(&w.chainOps, c)
			w.chainOps = append(w.chainOps, op{opFlush, c}, op{opDelete, c})
		}
		w.baseFresh = true
	}
	for _, bc := range baseChains {
		c := &knftables.Chain{Family: w.family, Table: w.table, Name: bc.name,
			Type: ptr.To(bc.chainType), Hook: ptr.To(bc.hook), Priority: ptr.To(bc.priority)}
		w.add(&w.chainOps, c)
		w.chainOps = append(w.chainOps, op{opFlush, c})
	}
	for _, name := range []string{servicesChain, serviceEndpointsCheckChain, nodePortEndpointsCheckChain,
		firewallCheckChain, clusterIPsCheckChain, rejectChain, markMasqChain, masqueradingChain} {
		c := &knftables.Chain{Family: w.family, Table: w.table, Name: name}
		w.add(&w.chainOps, c)
		w.chainOps = append(w.chainOps, op{opFlush, c})
	}
	vmapType := func(key string) string { return key + " : verdict" }
	addrKey := w.addrType + " . inet_proto . inet_service"
	for _, m := range []struct{ name, key, comment string }{
		{serviceIPsMap, addrKey, "ClusterIP, ExternalIP and LoadBalancer IP traffic"},
		{serviceNodePortsMap, "inet_proto . inet_service", "NodePort traffic"},
		{noEndpointServicesMap, addrKey, "drop or reject traffic to services without usable endpoints"},
		{noEndpointNodePortsMap, "inet_proto . inet_service", "drop or reject traffic to node ports without usable endpoints"},
	} {
		mp := &knftables.Map{Family: w.family, Table: w.table, Name: m.name, Type: vmapType(m.key), Comment: ptr.To(m.comment)}
		w.add(&w.chainOps, mp)
		w.flushElements(mp)
	}
	for _, m := range []struct{ name, typeOf, comment string }{
		{endpointsMap, w.ipX + " daddr . meta l4proto . tcp dport . numgen random mod 1 : " + w.ipX + " daddr . tcp dport",
			"endpoints by service address, protocol, port and index"},
		{nodePortEndpointsMap, "meta l4proto . tcp dport . numgen random mod 1 : " + w.ipX + " daddr . tcp dport",
			"endpoints by node port and index"},
	} {
		// "tcp dport", not "th dport": nft 1.0.6 refuses a rule added
		// later against a map whose typeof holds th dport, so the shared
		// chains look the map up with one rule per protocol.
		mp := &knftables.Map{Family: w.family, Table: w.table, Name: m.name, TypeOf: m.typeOf, Comment: ptr.To(m.comment)}
		w.add(&w.chainOps, mp)
		w.flushElements(mp)
	}
	for _, st := range []*knftables.Set{
		{Family: w.family, Table: w.table, Name: firewallIPsSet, Type: addrKey,
			Comment: ptr.To("destinations subject to loadBalancerSourceRanges")},
		{Family: w.family, Table: w.table, Name: firewallAllowSet, Type: addrKey + " . " + w.addrType,
			Flags: []knftables.SetFlag{knftables.IntervalFlag}, Comment: ptr.To("sources allowed by loadBalancerSourceRanges")},
	} {
		w.add(&w.chainOps, st)
		if st.Name == firewallAllowSet {
			w.chainOps = append(w.chainOps, op{opFlush, st})
		} else {
			w.flushElements(st)
		}
	}
	hairpin := &knftables.Set{Family: w.family, Table: w.table, Name: hairpinSet, Type: w.addrType + " . " + w.addrType,
		Comment: ptr.To("this node's endpoints, to masquerade one reaching itself through a service")}
	w.add(&w.chainOps, hairpin)
	w.flushElements(hairpin)
	cips := &knftables.Set{Family: w.family, Table: w.table, Name: clusterIPsSet, Type: w.addrType, Comment: ptr.To("cluster IPs of services")}
	w.add(&w.chainOps, cips)
	w.flushElements(cips)
	npIPs := &knftables.Set{Family: w.family, Table: w.table, Name: nodePortIPsSet, Type: w.addrType,
		Flags: []knftables.SetFlag{knftables.IntervalFlag}, Comment: ptr.To("ranges of local addresses that accept node-port traffic")}
	w.add(&w.chainOps, npIPs)
	if w.matchAllNP {
		// Added first so that the deletion cannot fail.
		w.chainOps = append(w.chainOps, op{opDelete, npIPs})
	} else {
		w.chainOps = append(w.chainOps, op{opFlush, npIPs})
		for _, p := range w.nodePortNets {
			w.add(&w.elemAdds, &knftables.Element{Family: w.family, Table: w.table, Set: nodePortIPsSet, Key: []string{p.String()}})
		}
	}

	rule := func(chain string, parts ...any) {
		w.add(&w.rules, &knftables.Rule{Family: w.family, Table: w.table, Chain: chain, Rule: knftables.Concat(parts...)})
	}
	for _, j := range jumpRules {
		rule(j.from, j.match, "jump", j.to)
	}
	rule(markMasqChain, "mark set mark or", w.mark)
	rule(masqueradingChain, "ct status dnat", w.ipX, "saddr .", w.ipX, "daddr", "@", hairpinSet, "jump", markMasqChain)
	rule(masqueradingChain, "mark and", w.mark, "== 0 return")
	// Clear the mark, so that a packet that goes through the stack again is
	// not masqueraded twice.
	rule(masqueradingChain, "mark set mark xor", w.mark)
	rule(masqueradingChain, "masquerade fully-random")
	rule(rejectChain, "reject")

	dst := w.ipX + " daddr"
	rule(servicesChain, dst, ". meta l4proto . th dport vmap", "@", serviceIPsMap)
	rule(serviceEndpointsCheckChain, dst, ". meta l4proto . th dport vmap", "@", noEndpointServicesMap)
	rule(firewallCheckChain, dst, ". meta l4proto . th dport", "@", firewallIPsSet,
		dst, ". meta l4proto . th dport .", w.ipX, "saddr !=", "@", firewallAllowSet, "drop")
	npMatch := []any{dst, "!=", w.loopback}
	if !w.matchAllNP {
		npMatch = append(npMatch, dst, "@", nodePortIPsSet)
	}
	rule(servicesChain, append(append([]any{"fib daddr type local"}, npMatch...), "meta l4proto . th dport vmap", "@", serviceNodePortsMap)...)
	// This chain runs at the input hook: the destination is local already.
	rule(nodePortEndpointsCheckChain, append(npMatch, "meta l4proto . th dport vmap", "@", noEndpointNodePortsMap)...)
	// Connections to a cluster IP that were not DNATed are to a port the
	// service does not have; those to an address of a service CIDR that
	// no service has are dropped.
	rule(clusterIPsCheckChain, dst, "@", clusterIPsSet, "reject")
	if len(w.serviceCIDRs) > 0 {
		cidrs := make([]string, 0, 2*len(w.serviceCIDRs))
		for i, p := range w.serviceCIDRs {
			if i > 0 {
				cidrs = append(cidrs, ",")
			}
			cidrs = append(cidrs, p.String())
		}
		rule(clusterIPsCheckChain, dst, "{", cidrs, "} drop")
	}
}

// flushElements queues the flush of one of the sets and maps whose
// elements the writer tracks, unless this full sync keeps them (keepElems).
func (w *Writer) flushElements(obj knftables.Object) {
	if !w.keepElems {
		w.chainOps = append(w.chainOps, op{opFlush, obj})
	}
}

// writeSharedChains brings the shared load-balancing chains to what the
// service-ips and service-nodeports elements will point at. It runs after
// the elements' diff, which counted the references. A partial sync adds
// those the kernel lacks and deletes none: a shared chain nothing points
// at is harmless, and endpoint counts come and go, so keeping it spares
// the next partial sync the chain and the kernel another binding of the
// endpoints map. A full sync writes every used one and deletes the
// others; desired, on a full sync that listed the table, gets the used
// ones, so that the listing's others are deleted as stale.
func (w *Writer) writeSharedChains(full bool, desired map[string]bool) {
	var names []string
	for name, n := range w.sharedRefs {
		if n > 0 && (full || !w.sharedWritten[name]) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		w.sharedChain(name, full)
	}
	for name, n := range w.sharedRefs {
		if n <= 0 {
			delete(w.sharedRefs, name)
		}
	}
	if !full {
		for _, name := range names {
			w.sharedWritten[name] = true
		}
		return
	}
	var gone []string
	for name := range w.sharedWritten {
		if w.sharedRefs[name] <= 0 {
			gone = append(gone, name)
		}
	}
	slices.Sort(gone)
	for _, name := range gone {
		delete(w.sharedWritten, name)
		if desired == nil {
			w.deleteChain(name)
		}
	}
	for name := range w.sharedRefs {
		w.sharedWritten[name] = true
		if desired != nil {
			desired[name] = true
		}
	}
}

// sharedChain queues a shared chain (added, and flushed by a full sync)
// and its rules: the masquerade mark of its kind, then one DNAT per
// protocol through the endpoints map, at index "numgen random mod K".
func (w *Writer) sharedChain(name string, full bool) {
	rest := strings.TrimPrefix(name, sharedChainPrefix)
	kind, key, m := lbInternal, w.ipX+" daddr . meta l4proto . ", endpointsMap
	switch {
	case strings.HasPrefix(rest, lbExternal):
		kind = lbExternal
	case strings.HasPrefix(rest, lbNodePort):
		kind, key, m = lbNodePort, "meta l4proto . ", nodePortEndpointsMap
	}
	k := strings.TrimPrefix(rest, kind)
	c := &knftables.Chain{Family: w.family, Table: w.table, Name: name}
	w.chainOps = append(w.chainOps, op{opAdd, c})
	if full {
		w.chainOps = append(w.chainOps, op{opFlush, c})
	}
	switch {
	case kind != lbInternal, w.cfg.Node.MasqueradeAll:
		// External traffic's endpoints may be on other nodes:
		// masquerade, so that replies come back through this node.
		w.rule(name, "jump "+markMasqChain)
	case w.local.Enabled():
		w.rule(name, w.ifNotLocal+" jump "+markMasqChain)
	}
	for _, proto := range []string{"tcp", "udp", "sctp"} {
		w.rule(name, "dnat "+w.ipX+" to "+key+proto+" dport . numgen random mod "+k+" map @"+m)
	}
}

func (w *Writer) add(phase *[]op, obj knftables.Object) {
	*phase = append(*phase, op{opAdd, obj})
}

type baseChain struct {
	name      string
	chainType knftables.BaseChainType
	hook      knftables.BaseChainHook
	priority  knftables.BaseChainPriority
}

// baseChains are kube-proxy's hooks and priorities. Only the firewall
// check runs before DNAT (dstnat-10), where it sees the address the client
// chose; every other filter chain runs at filter priority, after DNAT. At
// the input and forward hooks that changes nothing (the prerouting hook's
// DNAT is done by then), but at the output hook it is what lets a node's
// own connection that nat-output sent on to an endpoint (the "short-circuit
// local traffic" of an external address with a Local policy and no local
// endpoint) pass the endpoints check, which matches only a packet still
// addressed to the service.
var baseChains = []baseChain{
	{filterPreroutingPreDNATChain, knftables.FilterType, knftables.PreroutingHook, knftables.DNATPriority + "-10"},
	{filterOutputPreDNATChain, knftables.FilterType, knftables.OutputHook, knftables.DNATPriority + "-10"},
	{filterInputChain, knftables.FilterType, knftables.InputHook, knftables.FilterPriority},
	{filterForwardChain, knftables.FilterType, knftables.ForwardHook, knftables.FilterPriority},
	{filterOutputChain, knftables.FilterType, knftables.OutputHook, knftables.FilterPriority},
	{natPreroutingChain, knftables.NATType, knftables.PreroutingHook, knftables.DNATPriority},
	{natOutputChain, knftables.NATType, knftables.OutputHook, knftables.DNATPriority},
	{natPostroutingChain, knftables.NATType, knftables.PostroutingHook, knftables.SNATPriority},
}

// retiredBaseChains are the base chains of the earlier layout (kube-proxy's
// and this package's, which ran every filter chain before DNAT and caught
// what DNAT left at a cluster IP in a second output chain): the first sync
// deletes them, so that a table left by either does not keep checking
// packets twice.
var retiredBaseChains = []string{"filter-prerouting", "filter-output-post-dnat"}

// jumpRules are the base chains' rules. reject is allowed only at the
// input, forward and output hooks on older kernels (before 5.9), so the
// no-endpoint checks run there rather than at prerouting.
var jumpRules = []struct{ from, match, to string }{
	{filterInputChain, "ct state new", nodePortEndpointsCheckChain},
	{filterInputChain, "ct state new", serviceEndpointsCheckChain},
	{filterForwardChain, "ct state new", serviceEndpointsCheckChain},
	{filterOutputChain, "ct state new", serviceEndpointsCheckChain},
	{filterPreroutingPreDNATChain, "ct state new", firewallCheckChain},
	{filterOutputPreDNATChain, "ct state new", firewallCheckChain},
	{natOutputChain, "", servicesChain},
	{natPreroutingChain, "", servicesChain},
	{natPostroutingChain, "", masqueradingChain},
	{filterForwardChain, "ct state new", clusterIPsCheckChain},
	{filterOutputChain, "ct state new", clusterIPsCheckChain},
}

// localDetector takes the local-traffic detector of a sync whose node has
// pod ranges podCIDRs (they matter in NodeCIDR mode alone) and reports
// whether it changed. NewWriter has validated the rest of the Node config,
// so an error cannot come; were it to, the last detector is kept.
func (w *Writer) localDetector(logger klog.Logger, podCIDRs []netip.Prefix) bool {
	d, err := w.cfg.Node.LocalDetector(w.cfg.Family, podCIDRs)
	if err != nil {
		logger.Error(err, "Local traffic detection; keeping the last", "ipFamily", w.cfg.Family, "table", w.table)
		return false
	}
	if w.localKnown && d == w.local {
		return false
	}
	w.localKnown = true
	if !d.Enabled() && w.cfg.Node.DetectLocalMode == proxy.LocalModeNodeCIDR {
		logger.Error(nil, "Detect-local-mode NodeCIDR, but the node has no pod CIDR of the family: traffic from pods is not told from other traffic until it has one", "ipFamily", w.cfg.Family, "table", w.table)
	}
	w.setLocal(d)
	return true
}

// setLocal makes d the writer's detector, with its matches as rule text.
func (w *Writer) setLocal(d proxy.LocalDetector) {
	w.local, w.ifLocal = d, d.IfLocalNFT()
	w.ifNotLocal = strings.Join(d.IfNotLocalNFT(), " ")
}
