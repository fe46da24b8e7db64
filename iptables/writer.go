package iptables

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/logsafe"
	"github.com/proxykit/proxykit/portcheck"
	"github.com/proxykit/proxykit/proxy"
)

// DefaultLargeClusterThreshold is the number of endpoints above which the
// writer leaves out per-endpoint comments, when
// WriterConfig.LargeClusterThreshold is zero.
const DefaultLargeClusterThreshold = 1000

// NFTChainsPerCommit is the WriterConfig.ChainsPerCommit to use with the
// nft backend.
const NFTChainsPerCommit = 1000

// WriterConfig configures a [Writer]. Only Family is required.
type WriterConfig struct {
	// Family is the family the writer's rules are for, v1.IPv4Protocol
	// or v1.IPv6Protocol; one writer per family. Service ports whose
	// cluster IP is of the other family are skipped, and so are addresses
	// of the other family in the other fields and in Node.
	Family v1.IPFamily

	// Node holds the settings every mode shares: the node's name for
	// topology, the node-port addresses, the pod network for local
	// traffic detection, and masquerading. The writer reads the prefixes
	// of its own family and ignores the others, so one NodeConfig serves
	// every family: node ports are served on every local address when no
	// NodePortAddresses prefix is of the writer's family (as kube-proxy
	// filters --nodeport-addresses by family), and ClusterCIDR local-traffic
	// detection is off when no ClusterCIDRs prefix is. Node ports on loopback
	// addresses need LocalhostNodePorts, as in kube-proxy
	// (kubernetes#90259): without it a NodePortAddresses prefix inside the
	// loopback range is left out (the first Sync logs it), and loopback
	// addresses inside a wider prefix are excluded. Traffic to a cluster
	// IP that is not local (Node.LocalDetector: "! -s" the ClusterCIDRs
	// prefix, or the NodeCIDR mode's pod range, "! -i" the bridge, or
	// "! -i" the interface name prefix with "+") is masqueraded, and local
	// traffic to an external address of an externalTrafficPolicy Local
	// service is short-circuited to all endpoints. NewWriter fails on a
	// DetectLocalMode or interface name Node.LocalDetector refuses.
	Node proxy.NodeConfig

	// LocalhostNodePorts serves IPv4 node ports on the loopback addresses
	// (127.0.0.0/8) as well, as kube-proxy's --iptables-localhost-nodeports
	// does, which is on by default there; here the zero value is off. An
	// IPv6 writer ignores it: the kernel never routes ::1 to another host,
	// so IPv6 node ports are never served on localhost.
	//
	// It needs the sysctl net.ipv4.conf.all.route_localnet=1 (see
	// kernel.SysctlRouteLocalnet), which the caller sets before the first
	// sync when Writer.RouteLocalnet says so, and which lets other hosts
	// reach the node's loopback addresses too. To close that hole
	// (CVE-2020-8558) the writer adds kube-proxy's filter rule in
	// KUBE-FIREWALL, which drops packets to 127.0.0.0/8 from a source
	// outside it unless conntrack knows them as replies or as DNATed
	// traffic; Writer.JumpRules adds the jumps to it from INPUT and OUTPUT.
	// The kubelet writes the same chain and rule, and Cleanup leaves them.
	LocalhostNodePorts bool

	// RandomFully adds --random-fully to the MASQUERADE rule. Set it from
	// Interface.HasRandomFully.
	RandomFully bool

	// AcceptInvalid leaves out the rule that drops conntrack INVALID
	// packets in KUBE-FORWARD. Set it when nf_conntrack_tcp_be_liberal is
	// on, as kube-proxy does (kubernetes#74839, kubernetes#117924).
	AcceptInvalid bool

	// LargeClusterThreshold is the total number of endpoints above which
	// per-endpoint comments are left out to save bytes; zero means
	// DefaultLargeClusterThreshold.
	LargeClusterThreshold int

	// ChainsPerCommit, when positive, splits the nat table of a payload
	// into several commits ("*nat ... COMMIT" sections of the same
	// iptables-restore input) that each declare about that many chains;
	// the chains of one service port always share a commit.
	// iptables-nft-restore takes time quadratic in the number of chains one
	// commit declares with --noflush, so commits of a bounded number of
	// chains are far faster than one (BENCHMARKS.md).
	// Use NFTChainsPerCommit for the nft backend and zero for
	// legacy, whose iptables-restore rewrites the whole table at every
	// commit. The service chains come first and the commit that rewrites
	// the top-level chains (and deletes stale chains) last, so traffic keeps
	// flowing in between: a service's chains are rewritten in place, and new
	// services become reachable with the last commit. If a commit fails,
	// the ones before it stay applied and the next sync is full.
	ChainsPerCommit int

	// FullSyncPeriod, when positive, makes a sync full if the last full
	// sync is at least that old. Zero means full syncs happen only at the
	// start, after a failed restore, on node label changes and on
	// RequestFullSync.
	FullSyncPeriod time.Duration

	// Clock is read for FullSyncPeriod; nil means the real clock.
	Clock clock.PassiveClock

	// ChainPrefix starts the name of every chain the writer owns
	// (PREFIX-SERVICES, PREFIX-SVC-<hash>, PREFIX-MARK-MASQ, ...; see
	// ChainNames); "" means DefaultChainPrefix, kube-proxy's names. Give
	// two proxies on one node different prefixes, so that neither's
	// full sync flushes the other's chains. kube-proxy has no such
	// setting: beside kube-proxy, use anything but KUBE. NewWriter
	// refuses a prefix NewChainNames refuses.
	ChainPrefix string
}

// SyncResult is what [Writer.Sync] produced.
type SyncResult struct {
	// Full is true for a full sync: every chain is written and chains no
	// longer needed are deleted. Before applying a full sync, make sure
	// the built-in chains jump to the writer's chains (EnsureJumpRules).
	Full bool
	// Payload is the iptables-restore input: the nat table (in one
	// commit, or several with ChainsPerCommit), then the filter table;
	// a partial sync leaves out a table it does not change. Apply it with
	// one RestoreAll(ctx, Payload, NoFlushTables, RestoreCounters), or
	// print it for a dry run. It is empty when a partial sync found
	// nothing to change. It belongs to the writer and is overwritten by
	// the next Sync: copy it to keep it.
	Payload []byte
	// Lines is the number of lines of Payload.
	Lines int
	// ServicePortsWritten counts the service ports whose chains are in
	// Payload: all of them for a full sync, the changed ones otherwise.
	ServicePortsWritten int
	// ChainsDeleted counts the chains Payload deletes.
	ChainsDeleted int
	// ServicePorts and Endpoints count what the writer now programs: the
	// service ports with rules and the endpoints of those ports.
	ServicePorts, Endpoints int
	// LargeClusterMode is true when Endpoints exceeds the large-cluster
	// threshold, so per-endpoint comments are left out.
	LargeClusterMode bool
	// NoLocalEndpointsInternal and NoLocalEndpointsExternal count the
	// service ports whose internal (external) traffic policy is Local and
	// whose traffic is dropped because this node has no endpoint for them,
	// while other nodes do (kube-proxy's
	// sync_proxy_rules_no_local_endpoints_total).
	NoLocalEndpointsInternal, NoLocalEndpointsExternal int
}

// Writer renders service rules for iptables-restore, for one IP family.
// It keeps what it wrote last, so that a partial sync writes only the
// chains of the services that changed, and a full sync deletes the chains
// nothing needs any more. It runs nothing itself: the caller applies the
// payload with an [Interface] and reports the outcome with Applied.
//
// The layout is kube-proxy's: built-in chains jump to KUBE-SERVICES,
// KUBE-NODEPORTS, KUBE-EXTERNAL-SERVICES, KUBE-FORWARD,
// KUBE-PROXY-FIREWALL and KUBE-POSTROUTING; each service port has
// KUBE-SVC-, KUBE-SVL-, KUBE-EXT- and KUBE-FW- chains as its policies
// need, and each endpoint a KUBE-SEP- chain. With WriterConfig.ChainPrefix
// every one of these names starts with that prefix instead of KUBE.
//
// Partial syncs cost O(changed services). kube-proxy rewrites
// KUBE-SERVICES on every sync, which costs O(services) bytes however small
// the change; this writer never flushes a top-level chain in a partial
// sync. A service port whose set of top-level rules changed (it was added,
// deleted, lost or gained all endpoints, or changed addresses or ports)
// gets its old rules deleted one by one ("-D CHAIN rule", exactly as they
// were written, which the writer remembers) and its new ones inserted
// ("-I KUBE-SERVICES 1 rule", so they stay before the final node-port rule,
// or "-A" in chains where order does not matter). A change of endpoints
// alone never touches the top-level chains, and endpoint chains whose
// content did not change are not rewritten. Per-service dispatch chains
// between KUBE-SERVICES and KUBE-SVC-* were considered and rejected: they
// would still need a KUBE-SERVICES rule per service, and add a jump to
// every packet's path. If the kernel's rules drifted from what the writer
// believes (someone deleted a rule), the "-D" fails, the restore fails,
// and the next sync is full.
//
// A Writer is not safe for concurrent use, except RequestFullSync, which
// may be called from any goroutine.
type Writer struct {
	cfg           WriterConfig
	check         portcheck.Checker
	nodePortAddrs []netip.Prefix // Node's of the writer's family
	nodeIPs       []netip.Addr   // FamilyInput.NodeIPs of the last Sync
	cn            *ChainNames    // the names of the chains it owns
	jumpMasq      string         // " -j PREFIX-MARK-MASQ"
	droppedByFW   string         // " will be dropped by PREFIX-PROXY-FIREWALL"

	// local tells local traffic, as of the last Sync (see localDetector;
	// localKnown is false before the first); ifLocal and ifNotLocal are
	// its matches as rule text, " -s 10.0.0.0/8" and " ! -s 10.0.0.0/8".
	local               proxy.LocalDetector
	localKnown          bool
	ifLocal, ifNotLocal []byte

	clock         clock.PassiveClock
	threshold     int
	isIPv6        bool
	mark          string // "0x00004000"
	markMask      string // "0x00004000/0x00004000"
	loopback      string // "127.0.0.0/8" or "::1/128"
	nodePortMatch [][]byte
	// localhost is LocalhostNodePorts for IPv4; routeLocalnet says that
	// some node-port rule matches loopback addresses.
	localhost, routeLocalnet bool
	// acct says which nfacct counters the rules count packets in.
	acct Accounting
	// nodePortGuard, if set, is a rule that keeps loopback addresses
	// inside a NodePortAddresses prefix from the node-port rules.
	nodePortGuard []byte
	// skippedNodePortAddresses are loopback prefixes left out, logged by
	// the first Sync.
	skippedNodePortAddresses []netip.Prefix

	probabilities []string

	requestFull atomic.Bool
	needFull    bool
	lastFull    time.Time
	nodeLabels  map[string]string

	services       map[types.NamespacedName]*serviceState
	gen            uint64
	totalPorts     int
	totalEndpoints int
	noLocalInt     int
	noLocalExt     int
	// maybeStale holds chains that may exist in the kernel although no
	// service port owns them: chains the caller reported (NoteExistingChains)
	// and chains a failed restore was deleting. The next full sync deletes
	// those it does not need.
	maybeStale map[chainRef]struct{}
	// deleting holds the chains the last payload deletes, until Applied.
	deleting []chainRef
	// unapplied is true between a Sync and the matching Applied.
	unapplied bool
	// applied is what the service chains hold, for CheckDrift.
	applied appliedChains
	// tally, when set (by Mode), counts the rules of each applied
	// payload in the same walk that updates applied; payloadFull says
	// whether the payload of the last Sync is full.
	tally       *ruleTally
	payloadFull bool

	// Buffers reused from sync to sync.
	payload    []byte
	natTop     []byte
	filter     []byte
	scratch    []byte
	specs      []specRange
	names      []changetracker.ServicePortName
	full       []fullPort
	changed    []types.NamespacedName
	newSEPs    []sepState
	staleSEPs  []chainRef
	reuse      []bool
	oldMatched []bool
	lines      int
	// batchChains counts the chains declared in the current nat commit;
	// splitDue says the next declaration starts a new commit.
	batchChains int
	splitDue    bool
	// declared counts the service chains the payload declares.
	declared int
}

// serviceState is what the writer last wrote for the ports of one service.
type serviceState struct {
	ports []*portState
}

// portState is what the writer last wrote for one service port.
type portState struct {
	name changetracker.ServicePortName
	text portText  // name as restore text
	hash chainHash // hash part of its KUBE-SVC/SVL/EXT/FW chains
	gen  uint64    // last full sync that visited it
	// chains has bit k set when the chain of kind k (kindSVC..kindFW)
	// exists.
	chains uint8
	// seps are its endpoint chains, in the order of its endpoints.
	seps []sepState
	// sepFlags is what, besides the endpoint, the endpoint chains' content
	// depended on when they were written.
	sepFlags uint8
	// top holds its rules in the top-level chains.
	top       []topRule
	endpoints int
	noLocal   uint8 // bit 0: internal, bit 1: external
}

type sepState struct {
	ep   changetracker.Endpoint
	hash chainHash
}

const (
	sepAffinity uint8 = 1 << iota
	sepComments
)

// topChain is one of the top-level chains that holds per-service rules.
type topChain uint8

const (
	natServices topChain = iota
	natNodePorts
	filterServices
	filterExternal
	filterNodePorts
	filterFirewall
)

func (c topChain) isNAT() bool { return c <= natNodePorts }

func (w *Writer) topChainName(c topChain) Chain {
	switch c {
	case natServices, filterServices:
		return w.cn.services
	case natNodePorts, filterNodePorts:
		return w.cn.nodePorts
	case filterExternal:
		return w.cn.external
	}
	return w.cn.fw
}

type topRule struct {
	chain topChain
	spec  string // the rule after "-A CHAIN "
}

// specRange is a top-level rule being built in Writer.scratch.
type specRange struct {
	chain      topChain
	start, end int
}

// NewWriter returns a writer for cfg. It fails, naming the field, when the
// IP family is unknown, the chain prefix is not valid (see NewChainNames),
// the masquerade bit is out of range, or Node has two cluster CIDRs of the
// writer's family. The first Sync is full. cfg is copied; the writer never
// changes the caller's slices.
func NewWriter(cfg WriterConfig) (*Writer, error) {
	w := &Writer{
		cfg:        cfg,
		clock:      cfg.Clock,
		threshold:  cfg.LargeClusterThreshold,
		needFull:   true,
		services:   make(map[types.NamespacedName]*serviceState),
		maybeStale: make(map[chainRef]struct{}),
	}
	switch cfg.Family {
	case v1.IPv4Protocol:
		w.loopback = "127.0.0.0/8"
	case v1.IPv6Protocol:
		w.isIPv6 = true
		w.loopback = "::1/128"
	default:
		return nil, fmt.Errorf("iptables writer: unknown IP family %q", cfg.Family)
	}
	w.check = portcheck.New(cfg.Family)
	names, err := NewChainNames(cfg.ChainPrefix)
	if err != nil {
		return nil, fmt.Errorf("iptables writer: %w", err)
	}
	w.cn = names
	w.jumpMasq = " -j " + string(names.markMasq)
	w.droppedByFW = " will be dropped by " + string(names.fw)
	if w.clock == nil {
		w.clock = clock.RealClock{}
	}
	if w.threshold <= 0 {
		w.threshold = DefaultLargeClusterThreshold
	}
	bit, err := cfg.Node.MasqueradeMark()
	if err != nil {
		return nil, fmt.Errorf("iptables writer: Node.MasqueradeBit: %w", err)
	}
	w.mark = fmt.Sprintf("%#08x", uint32(1)<<bit)
	w.markMask = w.mark + "/" + w.mark
	if _, err := cfg.Node.LocalDetector(cfg.Family, nil); err != nil {
		return nil, fmt.Errorf("iptables writer: Node.%w", err)
	}
	w.nodePortAddrs = cfg.Node.NodePortPrefixes(cfg.Family)
	matchAll := len(w.nodePortAddrs) == 0
	if cfg.Node.NodePortPrimary {
		// The node's own addresses, which the inputs give: none before.
		w.nodePortAddrs, matchAll = nil, false
	}
	for _, p := range w.nodePortAddrs {
		if p.Bits() == 0 {
			matchAll = true
		}
	}
	w.localhost = cfg.LocalhostNodePorts && !w.isIPv6
	w.nodePortRules(matchAll)
	return w, nil
}

// nodePortRules fills w.nodePortMatch, the matches of the node-port rules
// at the end of KUBE-SERVICES, and w.nodePortGuard.
//
// Node ports are matched as "local address inside the prefix" rather than
// as a list of the node's addresses, so the rules stay right when
// addresses come and go and the writer needs no view of the interfaces.
func (w *Writer) nodePortRules(matchAll bool) {
	if matchAll {
		if w.localhost {
			w.routeLocalnet = true
			w.nodePortMatch = [][]byte{[]byte("-m addrtype --dst-type LOCAL")}
		} else {
			w.nodePortMatch = [][]byte{fmt.Appendf(nil, "-m addrtype --dst-type LOCAL ! -d %s", w.loopback)}
		}
		return
	}
	loopback := netip.MustParsePrefix(w.loopback)
	for _, p := range w.nodePortAddrs {
		if p.Overlaps(loopback) {
			switch {
			case w.localhost:
				w.routeLocalnet = true
			case p.Bits() >= loopback.Bits():
				w.skippedNodePortAddresses = append(w.skippedNodePortAddresses, p)
				continue
			default:
				// One rule can hold one -d: the loopback range is
				// returned from before the node-port rules instead.
				w.nodePortGuard = fmt.Appendf(nil, "-A %s -d %s -j RETURN", w.cn.services, w.loopback)
			}
		}
		w.nodePortMatch = append(w.nodePortMatch, fmt.Appendf(nil, "-d %s -m addrtype --dst-type LOCAL", p))
	}
}

// ChainNames returns the names of the chains the writer owns, from
// WriterConfig.ChainPrefix. They do not change.
func (w *Writer) ChainNames() *ChainNames { return w.cn }

// RouteLocalnet reports whether the writer serves node ports on IPv4
// loopback addresses (LocalhostNodePorts, with NodePortAddresses empty or
// covering 127.0.0.1), which works only once the caller has set
// net.ipv4.conf.all.route_localnet to 1, as kube-proxy does at start-up.
func (w *Writer) RouteLocalnet() bool { return w.routeLocalnet }

// JumpRules returns the package's JumpRules, plus, with
// LocalhostNodePorts, the jumps from INPUT and OUTPUT to KUBE-FIREWALL,
// written as the kubelet and kube-proxy write them (no comment), so that
// the three programs share one rule each. They come last, so that
// EnsureJumps, which prepends, puts them first in INPUT and OUTPUT, as
// kube-proxy does: martian localnet packets are dropped before
// KUBE-NODEPORTS accepts health-check node ports. The slice is new on
// every call.
func (w *Writer) JumpRules() []JumpRule {
	rules := w.cn.jumpRules()
	if w.localhost {
		rules = append(rules, localhostJumpRules()...)
	}
	return rules
}

// SetAccounting says which of kube-proxy's nfacct counters exist, so
// that the rules count packets in them as kube-proxy's do: with
// InvalidDropped, the rule in KUBE-FORWARD that drops conntrack INVALID
// packets (unless AcceptInvalid) counts them in NFAcctInvalidDropped;
// with LocalhostNodePorts, each node port of a service with endpoints
// gets a rule before its node-port rule that jumps to the same chain for
// packets to 127.0.0.0/8 and counts them in NFAcctLocalhostNodePorts, for
// an IPv4 writer whose node ports are served on loopback addresses
// (RouteLocalnet). The rules name the counters, so iptables-restore
// refuses them while a counter is missing: set only counters that exist.
// The zero Accounting, the default, counts nothing. A change makes the
// next Sync full, which rewrites the rules.
func (w *Writer) SetAccounting(a Accounting) {
	if a != w.acct {
		w.acct = a
		w.needFull = true
	}
}

// RequestFullSync makes the next Sync full: call it when another program
// may have flushed the rules (Interface.Monitor's reloadFunc). It is safe
// to call from any goroutine.
func (w *Writer) RequestFullSync() { w.requestFull.Store(true) }

// NoteExistingChains tells the writer about chains that exist in the nat
// table, typically read with iptables-save when the proxier starts, so that
// the next full sync deletes those of them that are service chains of its
// prefix (see ChainNames.IsServiceChain) no service needs. Other chains,
// including another prefix's service chains, are ignored.
func (w *Writer) NoteExistingChains(chains []Chain) {
	for _, c := range chains {
		if r, ok := w.cn.parseRef(string(c)); ok {
			w.maybeStale[r] = struct{}{}
		}
	}
}

// Applied reports the outcome of applying the payload of the last Sync:
// nil if iptables-restore succeeded. After an error the next sync is full,
// and it deletes the chains the failed payload meant to delete. A Sync
// whose outcome is never reported counts as failed. Calling Applied twice
// for one Sync, or before any Sync, does nothing.
func (w *Writer) Applied(err error) {
	if !w.unapplied {
		return
	}
	w.unapplied = false
	if err != nil {
		w.failed()
		return
	}
	w.deleting = w.deleting[:0]
	w.noteAppliedChains()
}

// failed records that the last payload may not have been applied.
func (w *Writer) failed() {
	w.needFull = true
	w.applied.known = false
	w.dropPending()
	for _, r := range w.deleting {
		w.maybeStale[r] = struct{}{}
	}
	w.deleting = w.deleting[:0]
}

// Sync renders the rules for in. The sync is full when one of these
// holds: it is the first, the last one failed or was never reported to
// Applied, RequestFullSync was called, in.Full is set, the node labels,
// the node's addresses of the writer's family or the service CIDRs changed, or
// FullSyncPeriod has passed since the last full sync.
// Otherwise it is partial and writes only the services named in the
// change results.
//
// Bad input is logged through the logger in ctx and skipped for that
// service port alone: a port whose cluster IP is not of the writer's
// family, or outside the known service CIDRs, gets no rules, and
// addresses of the other family are left out. An input whose Family is
// set and is not the writer's is logged, and its ports get no rules; an
// empty Family is read as the writer's.
func (w *Writer) Sync(ctx context.Context, in *proxy.FamilyInput) SyncResult {
	logger := klog.FromContext(ctx)
	if w.unapplied {
		logger.V(2).Info("Previous iptables payload was never reported applied; syncing everything")
		w.failed()
	}
	if len(w.skippedNodePortAddresses) > 0 {
		logger.Error(nil, "Node-port addresses inside the loopback range are left out: localhost node ports are off or not supported by the IP family",
			"nodePortAddresses", w.skippedNodePortAddresses, "ipFamily", w.cfg.Family)
		w.skippedNodePortAddresses = nil
	}
	requested := w.requestFull.Swap(false)
	full := w.needFull || requested || in.Full
	if !maps.Equal(w.nodeLabels, in.NodeLabels) {
		full = true
		w.nodeLabels = maps.Clone(in.NodeLabels)
	}
	if in.Family != "" && in.Family != w.cfg.Family {
		logger.Error(nil, "Input of another IP family; its service ports get no rules", "ipFamily", w.cfg.Family, "inputFamily", logsafe.Quote(string(in.Family)))
	}
	if ips := proxy.NodeIPsOf(w.cfg.Family, in.NodeIPs); !slices.Equal(ips, w.nodeIPs) {
		// A node address is matched in firewall rules and refused as a
		// cluster IP: every port is judged again.
		full = true
		w.nodeIPs = ips
		w.check = w.check.WithNodeIPs(ips)
		if w.cfg.Node.NodePortPrimary {
			// Node ports follow the node's addresses.
			w.nodePortAddrs = proxy.HostPrefixes(ips)
			w.nodePortMatch, w.nodePortGuard, w.routeLocalnet = nil, nil, false
			w.nodePortRules(false)
		}
	}
	if w.localDetector(logger, in.PodCIDRs) {
		// Masquerading and the short-circuit of pod traffic are in the
		// chains of every port.
		full = true
	}
	if check := w.check.WithServiceCIDRs(in.ServiceCIDRs); !check.SameServiceCIDRs(w.check) {
		// Ports refused or programmed under the old ranges are judged
		// again; ServiceCIDR objects seldom change.
		logger.V(2).Info("Service CIDRs changed; syncing everything", "ipFamily", w.cfg.Family)
		full = true
		w.check = check
	}
	now := w.clock.Now()
	if w.cfg.FullSyncPeriod > 0 && now.Sub(w.lastFull) >= w.cfg.FullSyncPeriod {
		full = true
	}

	if full {
		// The payload replaces the record of applied chains, or, should
		// it fail, leaves it unknown; those not read yet are not needed,
		// and their buffer serves this sync.
		w.dropPending()
		w.applied.known = false
	}
	w.payload = w.payload[:0]
	w.natTop = w.natTop[:0]
	w.filter = w.filter[:0]
	w.deleting = w.deleting[:0]
	w.lines = 0
	w.batchChains, w.splitDue = 0, false
	w.declared = 0
	var written int
	if full {
		written = w.syncFull(logger, in)
		w.lastFull = now
	} else {
		written = w.syncPartial(logger, in)
	}
	w.needFull = false
	w.unapplied = true
	w.payloadFull = full
	res := SyncResult{
		Full:                     full,
		Payload:                  w.payload,
		Lines:                    w.lines,
		ServicePortsWritten:      written,
		ChainsDeleted:            len(w.deleting),
		ServicePorts:             w.totalPorts,
		Endpoints:                w.totalEndpoints,
		LargeClusterMode:         w.largeCluster(),
		NoLocalEndpointsInternal: w.noLocalInt,
		NoLocalEndpointsExternal: w.noLocalExt,
	}
	logger.V(2).Info("Rendered iptables rules", "ipFamily", w.cfg.Family, "full", full,
		"servicePortsWritten", written, "bytes", len(res.Payload), "lines", res.Lines,
		"chainsDeleted", res.ChainsDeleted, "servicePorts", res.ServicePorts, "endpoints", res.Endpoints)
	return res
}

func (w *Writer) largeCluster() bool { return w.totalEndpoints > w.threshold }

// payloadEstimate adds up, port by port, about the bytes a full payload
// takes, so that the first full sync allocates its buffer once instead of
// growing it step by step (which, at tens of megabytes, would allocate
// several times the payload), and no larger than it needs: the buffer is
// most of that sync's heap. Each port's rules are counted from what makes
// their length (chain names, its name, its addresses, endpoints, node
// port, affinity), with addresses at their longest, so the estimate is a
// little above the payload for every kind of Service; the per-endpoint
// comments of a small cluster are counted apart, as whether they are
// written is known only once every port has been counted.
type payloadEstimate struct {
	// payload counts the whole payload without comments; comments the
	// bytes the per-endpoint comments add; natTop the top-level nat
	// rules, which are written aside first (Writer.natTop).
	payload, comments, natTop int
}

// The longest text of an address and of a port number.
const (
	maxIPv4Len = len("255.255.255.255")
	maxIPv6Len = len("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]")
	maxPortLen = len("65535")
)

// add counts one service port with endpoints eps.
func (e *payloadEstimate) add(w *Writer, name changetracker.ServicePortName, svc changetracker.ServicePort, eps []changetracker.Endpoint) {
	endpoints, listed := len(eps), len(eps)
	if svc.UsesLocalEndpoints() {
		// The local endpoints have a rule in PREFIX-SVL- too, or, when
		// no traffic uses the Cluster policy, they alone have rules.
		local := 0
		for _, ep := range eps {
			if ep != nil && ep.IsLocal() {
				local++
			}
		}
		if svc.UsesClusterEndpoints() {
			listed += local
		} else {
			endpoints, listed = local, local
		}
	}
	ip := maxIPv4Len
	if w.isIPv6 {
		ip = maxIPv6Len
	}
	chain := len(w.cn.kinds[kindSVC]) + hashLen // SVC, SVL, EXT, SEP alike
	text := len(name.Namespace) + 1 + len(name.Name) + 1 + len(name.Port)
	proto := len(" -m  -p ") + 2*len(protocolName(name.Protocol))
	dest := len(" -d ") + ip + len(" --dport ") + maxPortLen
	comment := len(` -m comment --comment "`) + text + len(` loadbalancer IP"`)
	jump := len(" -j ") + chain + 1
	masq := len(w.jumpMasq) + 1
	services := len("-A ") + len(w.cn.services)

	// The port's own chain, its masquerade rule, and its rule in
	// PREFIX-SERVICES.
	e.payload += chain + len(": - [0:0]\n")
	e.payload += len("-A ") + chain + comment + proto + dest + len(w.ifNotLocal) + masq
	e.natTop += services + comment + proto + dest + jump
	// Or, when its traffic is local and dropped or rejected, rules of the
	// same length in the filter table, which the three above cover.
	extra := 0
	if svc.ExternallyAccessible() {
		// PREFIX-EXT-, with a masquerade rule and a jump, or for the
		// Local policy up to three rules with comments and a jump.
		rules := 1
		if svc.ExternalPolicyLocal() {
			rules = 3
		}
		extra += chain + len(": - [0:0]\n")
		extra += rules*(len("-A ")+chain+len(` -m comment --comment "masquerade LOCAL traffic for  external destinations"`)+text+len(" -m addrtype --src-type LOCAL")+jump) +
			len("-A ") + chain + jump
	}
	if svc.NodePort() != 0 {
		// Its rule in PREFIX-NODEPORTS, and the counted localhost one
		// before it.
		rule := len("-A ") + len(w.cn.nodePorts) + len(" -m comment --comment ") + text + proto + len(" --dport ") + maxPortLen + jump
		e.natTop += rule
		if w.acct.LocalhostNodePorts && w.routeLocalnet {
			e.natTop += rule + len(" -d 127.0.0.0/8 -m nfacct --nfacct-name ") + len(NFAcctLocalhostNodePorts)
		}
	}
	if hc := svc.HealthCheckNodePort(); hc != 0 {
		extra += len("-A ") + len(w.cn.nodePorts) + comment + len(" -m tcp -p tcp --dport ") + maxPortLen + len(" -j ACCEPT\n")
	}
	// An external IP or VIP: a rule in nat.
	addrs := len(svc.ExternalIPs()) + len(svc.LoadBalancerVIPs())
	filterRule := len("-A ") + len(w.cn.external) + comment + len(" traffic not accepted by ") + chain + proto + dest + len(" -j REJECT\n")
	e.natTop += addrs * (services + comment + proto + dest + jump)
	if endpoints == 0 {
		// Without endpoints, rules that reject its traffic in filter
		// instead of its endpoints' rules; other ports without
		// endpoints for some policy have endpoints' rules to spare.
		extra += (addrs + 2) * filterRule
	}
	if ranges := len(svc.LoadBalancerSourceRanges()); ranges > 0 {
		// PREFIX-FW-, a rule per range and per VIP, the last one, and
		// a drop rule per VIP in filter.
		extra += chain + len(": - [0:0]\n")
		extra += (ranges + addrs + 1) * (len("-A ") + chain + comment + len(" -s ") + ip + len("/128") + jump)
		extra += addrs * filterRule
	}
	e.payload += extra

	// Per endpoint: its chain's declaration, and the masquerade and DNAT
	// rules in it; per listing in a port's chain, a rule there.
	listing := len("-A ") + chain + len(" -m statistic --mode random --probability 0.1234567890") + jump
	perEndpoint := chain + len(": - [0:0]\n") +
		len("-A ") + chain + len(" -s ") + ip + masq +
		len("-A ") + chain + proto + len(" -j DNAT --to-destination ") + ip + 1 + maxPortLen + 1
	endpointComment := len(` -m comment --comment "`) + text + len(" -> ") + ip + 1 + maxPortLen + 1
	sepComments := 2 * (len(" -m comment --comment ") + text)
	listingComments := endpointComment
	if svc.SessionAffinityType() == v1.ServiceAffinityClientIP {
		// A "recent" rule per listing, before the others, and the
		// "recent" match of the DNAT rule.
		seconds := len(strconv.Itoa(svc.StickyMaxAgeSeconds()))
		listing += len("-A ") + chain + len(" -m recent --name ") + chain + len(" --rcheck --seconds ") + seconds + len(" --reap") + jump
		listingComments += endpointComment
		perEndpoint += len(" -m recent --name ") + chain + len(" --set")
	}
	e.payload += endpoints*perEndpoint + listed*listing
	e.comments += endpoints*sepComments + listed*listingComments
}

// size returns the estimate of the whole payload, comments included when
// the writer writes them.
func (e *payloadEstimate) size(w *Writer) int {
	n := 4096 + e.payload + e.natTop
	if !w.largeCluster() {
		n += e.comments
	}
	return n
}

// fullPort is a port a full sync writes, with its map values.
type fullPort struct {
	name changetracker.ServicePortName
	svc  changetracker.ServicePort
	eps  []changetracker.Endpoint
}

// growBuffer returns b, or a copy of it, with room for n more bytes. It
// asks for the memory with make rather than slices.Grow, which appends n
// zero bytes: for a payload of tens of megabytes that zeroing is a large
// part of the first full sync, and the sync overwrites the bytes at once,
// whereas memory the runtime takes fresh from the system is zero already
// and is not cleared again.
func growBuffer(b []byte, n int) []byte {
	if n <= cap(b)-len(b) {
		return b
	}
	nb := make([]byte, len(b), len(b)+n)
	adviseHugePages(nb)
	copy(nb, b)
	return nb
}

// syncFull renders every service port, flushing and refilling the
// top-level chains, and returns how many ports it wrote.
func (w *Writer) syncFull(logger klog.Logger, in *proxy.FamilyInput) int {
	w.gen++
	// Each port's ServicePort and endpoints are looked up once, here:
	// at tens of thousands of ports the maps do not fit in the caches,
	// and every look-up costs a miss or two.
	w.full = slices.Grow(w.full[:0], len(in.Services))
	total := 0
	var est payloadEstimate
	for name, svc := range in.Services {
		if !w.usable(logger, name, svc) {
			continue
		}
		eps := in.Endpoints[name]
		w.full = append(w.full, fullPort{name: name, svc: svc, eps: eps})
		total += len(eps)
		est.add(w, name, svc, eps)
	}
	slices.SortFunc(w.full, func(a, b fullPort) int { return changetracker.CompareServicePortNames(a.name, b.name) })
	w.totalEndpoints = total
	w.totalPorts = len(w.full)
	w.noLocalInt, w.noLocalExt = 0, 0

	b := w.endLine(append(growBuffer(w.payload, est.size(w)), "*nat"...))
	// The top-level nat rules, a cluster-IP rule or so per port, are
	// written aside until the chains they jump to are declared; sized at
	// once, that buffer is not copied over and over as it grows.
	w.natTop = growBuffer(w.natTop, est.natTop)
	b = w.chainLine(b, w.cn.postrouting)
	b = w.chainLine(b, w.cn.markMasq)
	b = w.staticNATRules(b)

	if len(w.services) == 0 {
		// The first full sync: sized at once (a port per Service is
		// the usual case), the map is not grown and rehashed step by
		// step.
		w.services = make(map[types.NamespacedName]*serviceState, len(w.full))
	}
	var ss *serviceState
	for i := range w.full {
		name := w.full[i].name
		if ss == nil || ss.ports[0].name.NamespacedName != name.NamespacedName {
			ss = w.services[name.NamespacedName]
			if ss == nil {
				ss = &serviceState{}
				w.services[name.NamespacedName] = ss
			}
		}
		ps := ss.port(name)
		if ps == nil {
			ps = w.newPortState(name)
			ss.ports = append(ss.ports, ps)
		}
		ps.gen = w.gen
		w.startPort()
		b = w.writePort(b, ps, w.full[i].svc, w.usableEndpoints(logger, name, w.full[i].eps), true)
		// The endpoint totals count what the maps hold, bad endpoints too.
		ps.endpoints = len(w.full[i].eps)
		w.countNoLocal(ps, +1)
	}
	written := len(w.full)
	// Do not keep the maps' values alive until the next full sync.
	clear(w.full)

	// Ports that are gone, or were skipped as unusable.
	for nn, ss := range w.services {
		ss.ports = slices.DeleteFunc(ss.ports, func(ps *portState) bool {
			if ps.gen == w.gen {
				return false
			}
			w.deletePortChains(ps)
			return true
		})
		if len(ss.ports) == 0 {
			delete(w.services, nn)
		}
	}
	// Everything left in maybeStale is needed by no port: writePort and
	// deletePortChains took out what they wrote or deleted.
	for r := range w.maybeStale {
		w.deleting = append(w.deleting, r)
	}
	clear(w.maybeStale)

	// The top-level chains are flushed and refilled together, after every
	// chain they send traffic to exists.
	b = w.chainLine(b, w.cn.services)
	b = w.chainLine(b, w.cn.nodePorts)
	b = append(b, w.natTop...)
	if w.nodePortGuard != nil {
		b = w.endLine(append(b, w.nodePortGuard...))
	}
	for _, m := range w.nodePortMatch {
		b = append(append(b, "-A "...), w.cn.services...)
		b = append(b, " -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" "...)
		b = append(b, m...)
		b = w.endLine(append(append(b, " -j "...), w.cn.nodePorts...))
	}
	b = w.writeDeletions(b)
	b = w.endLine(append(b, "COMMIT"...))

	b = w.endLine(append(b, "*filter"...))
	for _, c := range [...]Chain{w.cn.services, w.cn.external, w.cn.forward, w.cn.nodePorts, w.cn.fw} {
		b = w.chainLine(b, c)
	}
	if w.localhost {
		b = w.chainLine(b, kubeFirewallChain)
	}
	b = append(b, w.filter...)
	b = w.staticFilterRules(b)
	b = w.endLine(append(b, "COMMIT"...))
	w.payload = b
	return written
}

// syncPartial renders the service ports of the changed services and
// returns how many it wrote.
func (w *Writer) syncPartial(logger klog.Logger, in *proxy.FamilyInput) int {
	svcChanged := in.ServiceChanges.UpdatedServices
	w.changed = changetracker.ChangedServices(w.changed, in.ServiceChanges, in.EndpointChanges)
	if len(w.changed) == 0 {
		return 0
	}

	// The ports a changed service has now. For a service whose Service
	// object did not change they are the ones written last time (its ports
	// in the map change only with the Service, so those are all of its
	// usable ones, none for a service without); otherwise they are what
	// the Update that changed it said.
	svcPorts := in.ServiceChanges.PortsIn(in.Services)

	// The endpoint total decides whether comments are written, so it is
	// brought up to date before anything is written.
	w.names = w.names[:0]
	for _, nn := range w.changed {
		ss := w.services[nn]
		if svcChanged.Has(nn) {
			for _, name := range svcPorts[nn] {
				if w.usable(logger, name, in.Services[name]) {
					w.names = append(w.names, name)
				}
			}
		} else if ss != nil {
			for _, ps := range ss.ports {
				if w.usable(logger, ps.name, in.Services[ps.name]) {
					w.names = append(w.names, ps.name)
				}
			}
		}
		if ss != nil {
			for _, ps := range ss.ports {
				w.totalEndpoints -= ps.endpoints
				w.totalPorts--
			}
		}
	}
	for _, name := range w.names {
		w.totalEndpoints += len(in.Endpoints[name])
		w.totalPorts++
	}

	b := w.endLine(append(w.payload, "*nat"...))
	start := len(b)
	k := 0
	for _, nn := range w.changed {
		ss := w.services[nn]
		if ss == nil {
			ss = &serviceState{}
		}
		// Mark the ports that stay; the others are deleted below.
		w.gen++
		for ; k < len(w.names) && w.names[k].NamespacedName == nn; k++ {
			name := w.names[k]
			ps := ss.port(name)
			if ps == nil {
				ps = w.newPortState(name)
				ss.ports = append(ss.ports, ps)
			} else {
				w.countNoLocal(ps, -1)
			}
			ps.gen = w.gen
			w.startPort()
			b = w.writePort(b, ps, in.Services[name], w.usableEndpoints(logger, name, in.Endpoints[name]), false)
			ps.endpoints = len(in.Endpoints[name])
			w.countNoLocal(ps, +1)
		}
		ss.ports = slices.DeleteFunc(ss.ports, func(ps *portState) bool {
			if ps.gen == w.gen {
				return false
			}
			w.countNoLocal(ps, -1)
			for _, r := range ps.top {
				w.topRuleDelete(r)
			}
			w.deletePortChains(ps)
			return true
		})
		if len(ss.ports) == 0 {
			delete(w.services, nn)
		} else {
			w.services[nn] = ss
		}
	}
	b = append(b, w.natTop...)
	b = w.writeDeletions(b)
	if len(b) == start {
		b = b[:0]
		w.lines--
	} else {
		b = w.endLine(append(b, "COMMIT"...))
	}
	if len(w.filter) > 0 {
		b = w.endLine(append(b, "*filter"...))
		b = append(b, w.filter...)
		b = w.endLine(append(b, "COMMIT"...))
	}
	w.payload = b
	return len(w.names)
}

// usable reports whether a service port can get rules in this family.
// It is the writer's own check of every field that reaches the payload,
// done whatever the tracker checked, since a caller's MakeServicePortFunc
// or its own ServicePort implementation can hand the writer anything: a
// field iptables-restore would refuse would fail the restore of every
// service port, not only this one. A port it refuses is logged once per
// sync, naming it and the reason, and gets no rules.
func (w *Writer) usable(logger klog.Logger, name changetracker.ServicePortName, svc changetracker.ServicePort) bool {
	var reason string
	var value any
	// This runs for every port at every full sync: the check alone, which
	// is what making the text would refuse.
	if err := checkPortText(name); err != nil {
		reason, value = "its name cannot be written for iptables-restore", err.Error()
	}
	return w.check.Usable(logger, name, svc, reason, value)
}

// ownAddr reports whether ip, from the API, is an address of the writer's
// family that iptables takes as written (portcheck.Checker.OwnAddr).
func (w *Writer) ownAddr(ip netip.Addr) bool { return w.check.OwnAddr(ip) }

// ownRange is ownAddr for a prefix.
func (w *Writer) ownRange(p netip.Prefix) bool { return w.check.OwnRange(p) }

// restrictsSources reports whether svc's loadBalancerSourceRanges restrict
// the sources of this family (no KUBE-FW- chain, no firewall rule when
// they do not; portcheck.Checker.RestrictsSources).
func (w *Writer) restrictsSources(svc changetracker.ServicePort) bool {
	return w.check.RestrictsSources(svc)
}

// usableEndpoints returns eps without the endpoints whose address or port
// iptables-restore would refuse, logging each one it leaves out
// (portcheck.Checker.UsableEndpoints).
func (w *Writer) usableEndpoints(logger klog.Logger, name changetracker.ServicePortName, eps []changetracker.Endpoint) []changetracker.Endpoint {
	return w.check.UsableEndpoints(logger, name, eps)
}

func (ss *serviceState) port(name changetracker.ServicePortName) *portState {
	for _, ps := range ss.ports {
		if ps.name == name {
			return ps
		}
	}
	return nil
}

// newPortState is called only for names usable accepted, whose text
// makePortText makes without error.
func (w *Writer) newPortState(name changetracker.ServicePortName) *portState {
	var text portText
	text, w.scratch, _ = makePortText(w.scratch, name)
	w.scratch = appendPortKey(w.scratch[:0], name)
	return &portState{name: name, text: text, hash: hashInto(w.scratch)}
}

func (w *Writer) countNoLocal(ps *portState, sign int) {
	if ps.noLocal&1 != 0 {
		w.noLocalInt += sign
	}
	if ps.noLocal&2 != 0 {
		w.noLocalExt += sign
	}
}

// deletePortChains queues the deletion of every chain of ps.
func (w *Writer) deletePortChains(ps *portState) {
	for k := kindSVC; k < kindSEP; k++ {
		if ps.chains&(1<<k) != 0 {
			w.deleteChain(chainRef{kind: k, hash: ps.hash})
		}
	}
	for i := range ps.seps {
		w.deleteChain(chainRef{kind: kindSEP, hash: ps.seps[i].hash})
	}
	ps.chains = 0
	ps.seps = ps.seps[:0]
}

func (w *Writer) deleteChain(r chainRef) {
	if len(w.maybeStale) > 0 {
		delete(w.maybeStale, r)
	}
	w.deleting = append(w.deleting, r)
}

// writeDeletions flushes then deletes the chains in w.deleting: all
// flushes first, since a chain can only be deleted once no other chain
// jumps to it.
func (w *Writer) writeDeletions(b []byte) []byte {
	slices.SortFunc(w.deleting, compareChainRefs)
	for _, r := range w.deleting {
		b = append(b, ':')
		b = r.appendTo(b, w.cn)
		b = w.endLine(append(b, " - [0:0]"...))
	}
	for _, r := range w.deleting {
		b = append(b, "-X "...)
		b = w.endLine(r.appendTo(b, w.cn))
	}
	return b
}

// startPort is called before a service port's chains are written: if the
// current nat commit has its share of chains, the port's first declaration
// starts a new one.
func (w *Writer) startPort() {
	w.splitDue = w.cfg.ChainsPerCommit > 0 && w.batchChains >= w.cfg.ChainsPerCommit
}

func (w *Writer) chainLine(b []byte, c Chain) []byte {
	b = append(b, ':')
	b = append(b, c...)
	return w.endLine(append(b, " - [0:0]"...))
}

func (w *Writer) endLine(b []byte) []byte {
	w.lines++
	return append(b, '\n')
}

func (w *Writer) staticNATRules(b []byte) []byte {
	b = ruleOf(b, w.cn.postrouting, " -m mark ! --mark ")
	b = w.endLine(append(append(b, w.markMask...), " -j RETURN"...))
	// Clear the mark, so a packet that goes through the stack again is not
	// masqueraded twice.
	b = ruleOf(b, w.cn.postrouting, " -j MARK --xor-mark ")
	b = w.endLine(append(b, w.mark...))
	b = ruleOf(b, w.cn.postrouting, " -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE")
	if w.cfg.RandomFully {
		b = append(b, " --random-fully"...)
	}
	b = w.endLine(b)
	b = ruleOf(b, w.cn.markMasq, " -j MARK --or-mark ")
	return w.endLine(append(b, w.mark...))
}

func (w *Writer) staticFilterRules(b []byte) []byte {
	if !w.cfg.AcceptInvalid {
		b = ruleOf(b, w.cn.forward, " -m conntrack --ctstate INVALID")
		if w.acct.InvalidDropped {
			b = append(b, " -m nfacct --nfacct-name "+NFAcctInvalidDropped...)
		}
		b = w.endLine(append(b, " -j DROP"...))
	}
	// Marked traffic is service traffic: accept it even if the FORWARD
	// policy is DROP.
	b = ruleOf(b, w.cn.forward, " -m comment --comment \"kubernetes forwarding rules\" -m mark --mark ")
	b = w.endLine(append(append(b, w.markMask...), " -j ACCEPT"...))
	b = w.endLine(ruleOf(b, w.cn.forward, " -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"))
	if w.localhost {
		// route_localnet lets other hosts reach 127.0.0.0/8 on this node
		// (CVE-2020-8558, kubernetes#90259): drop what they send there,
		// except replies and what node-port DNAT sent there itself.
		// This is kube-proxy's and the kubelet's rule, byte for byte.
		b = w.endLine(append(b, "-A KUBE-FIREWALL -m comment --comment \"block incoming localnet connections\" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP"...))
	}
	return b
}

// ruleOf appends "-A CHAIN" and the rest of a rule, which starts with a
// space.
func ruleOf(b []byte, c Chain, rest string) []byte {
	b = append(append(b, "-A "...), c...)
	return append(b, rest...)
}

// probability returns 1/n formatted as kube-proxy does, computed once per n.
func (w *Writer) probability(n int) string {
	for len(w.probabilities) <= n {
		k := len(w.probabilities)
		if k == 0 {
			w.probabilities = append(w.probabilities, "")
			continue
		}
		w.probabilities = append(w.probabilities, strconv.FormatFloat(1/float64(k), 'f', 10, 64))
	}
	return w.probabilities[n]
}

func compareChainRefs(a, b chainRef) int {
	if a.kind != b.kind {
		return int(a.kind) - int(b.kind)
	}
	return strings.Compare(string(a.hash[:]), string(b.hash[:]))
}

// localDetector takes the local-traffic detector of a sync whose node has
// pod ranges podCIDRs (they matter in NodeCIDR mode alone) and reports
// whether it changed. NewWriter has validated the rest of the Node config,
// so an error cannot come; were it to, the last detector is kept.
func (w *Writer) localDetector(logger klog.Logger, podCIDRs []netip.Prefix) bool {
	d, err := w.cfg.Node.LocalDetector(w.cfg.Family, podCIDRs)
	if err != nil {
		logger.Error(err, "Local traffic detection; keeping the last", "ipFamily", w.cfg.Family)
		return false
	}
	if w.localKnown && d == w.local {
		return false
	}
	w.localKnown = true
	if !d.Enabled() && w.cfg.Node.DetectLocalMode == proxy.LocalModeNodeCIDR {
		logger.Error(nil, "Detect-local-mode NodeCIDR, but the node has no pod CIDR of the family: traffic from pods is not told from other traffic until it has one", "ipFamily", w.cfg.Family)
	}
	w.setLocal(d)
	return true
}

// setLocal makes d the writer's detector, with its matches as rule text.
func (w *Writer) setLocal(d proxy.LocalDetector) {
	w.local, w.ifLocal, w.ifNotLocal = d, nil, nil
	for _, a := range d.IfLocal() {
		w.ifLocal = append(append(w.ifLocal, ' '), a...)
	}
	for _, a := range d.IfNotLocal() {
		w.ifNotLocal = append(append(w.ifNotLocal, ' '), a...)
	}
}
