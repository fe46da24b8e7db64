package ipvsmode

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/logsafe"
	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/proxy"
)

// WriterConfig configures a [Writer]. Only Family is required.
type WriterConfig struct {
	// Family is the family translated, v1.IPv4Protocol or
	// v1.IPv6Protocol; a dual-stack node has one Writer per family.
	// Service ports whose cluster IP is of the other family are skipped,
	// and so are addresses of the other family anywhere else.
	Family v1.IPFamily

	// Node holds the settings every mode shares; the translator reads the
	// prefixes of its own family. Node ports get a virtual server on each
	// of the input's NodeIPs inside Node.NodePortAddresses: none of this
	// family, or a prefix of length 0, means all of them, as in
	// kube-proxy. Loopback addresses never serve node ports
	// (kubernetes#90259). With no address left, node ports get no virtual
	// server. Traffic to a cluster IP that is not local by
	// Node.LocalDetector (of the input's PodCIDRs in NodeCIDR mode) is
	// masqueraded; without a detector (ClusterCIDR mode without a
	// ClusterCIDRs prefix of the family, NodeCIDR mode before the node
	// has a pod range), only traffic the node sends from a service
	// address is, as kube-proxy does.
	Node proxy.NodeConfig

	// RandomFully adds --random-fully to the MASQUERADE rule. Set it from
	// iptables.Interface.HasRandomFully.
	RandomFully bool

	// Scheduler is the IPVS scheduler of every virtual server; empty
	// means DefaultScheduler. The kernel needs its module (ip_vs_NAME).
	Scheduler string

	// SchedulerFlags are added to every virtual server: FlagSched1,
	// FlagSched2 and FlagSched3 are the scheduler's options (kube-proxy
	// sets FlagSched2 with "mh", to hash the source port too).
	SchedulerFlags ipvs.Flags

	// ChainPrefix starts the name of every chain and ipset the
	// translation names (see NewNames); "" means
	// iptables.DefaultChainPrefix, kube-proxy's names. Use the
	// Names.SetPrefix of the same prefix for the ipset reconciler.
	ChainPrefix string
}

// SyncResult is the whole IPVS-mode state of one family, as
// [Writer.Translate] renders it. Its slices belong to the Writer
// and are overwritten by the next Translate: apply (or copy) them first.
//
// Apply it in this order, as [Applier] does: Sets (the rules match on
// them), then the jump rules ([Names.EnsureJumpRules]) and Payload, then
// Services. Each sync is a full reconcile; the reconcilers make one that
// changes nothing write nothing.
type SyncResult struct {
	// Family is the translator's family.
	Family v1.IPFamily

	// Services are the virtual servers, for Reconciler.Reconcile: each
	// service port's cluster IP, external IPs and load-balancer VIPs
	// (bound to the dummy interface, unless the node has the address
	// already), and its node port on each node-port address (not bound),
	// in the order of the service port names. Real servers have weight 1.
	// A service port with no usable endpoint has virtual servers with no
	// real server: the kernel answers a new connection to them with ICMP
	// port unreachable, so clients are refused at once.
	Services []ipvs.Service

	// Sets are every ipset of the family, with their members, in a fixed
	// order, empty ones included, for ipset.Reconciler.Reconcile (with
	// SetPrefix, or Names.SetPrefix with another ChainPrefix). The
	// names are kube-proxy's, with "KUBE-6-" instead of "KUBE-" for IPv6,
	// and the chain prefix instead of KUBE.
	Sets []ipset.Desired

	// JumpRules are the rules from built-in chains into the payload's
	// chains ([Names.JumpRules]); apply them with
	// iptables.EnsureJumps before Payload, as [Applier] does. A
	// SyncResult that was not made by a Writer, with none, gets
	// [Names.JumpRules].
	JumpRules []iptables.JumpRule

	// Payload is the iptables-restore input for the family's nat and
	// filter tables (iptables or ip6tables). It declares, and so flushes,
	// every chain it fills. Apply it with RestoreAll(ctx, Payload,
	// iptables.NoFlushTables, iptables.RestoreCounters) after
	// the JumpRules. Its size does not depend on the number of services.
	Payload []byte
	// Lines is the number of lines of Payload.
	Lines int

	// ServicePorts counts the service ports translated; SkippedServicePorts
	// those skipped as bad input (each is logged).
	ServicePorts, SkippedServicePorts int
	// NoLocalEndpointsInternal and NoLocalEndpointsExternal count the
	// service ports whose internal (external) traffic policy is Local and
	// that have endpoints, none of them on this node (kube-proxy's
	// sync_proxy_rules_no_local_endpoints_total).
	NoLocalEndpointsInternal, NoLocalEndpointsExternal int
}

// Writer renders the IPVS-mode state of one IP family from the
// tracker's maps: the virtual servers, the ipsets and the few iptables rules
// IPVS mode needs (masquerading, source ranges, node ports, and refusing
// ports of service addresses that no service uses). It reads nothing from
// the kernel and keeps no state between calls except buffers, so that a
// sync of 10,000 services allocates little.
//
// Traffic policies follow kube-proxy's IPVS mode. Cluster IPs use the
// endpoints for internal traffic: with internalTrafficPolicy Local only
// this node's, and none when it has none, so that the cluster IP refuses
// connections rather than send them to another node (kube-proxy's IPVS
// mode may do that when the Service also has Cluster external traffic).
// External IPs, load-balancer VIPs
// and node ports use this node's endpoints under externalTrafficPolicy
// Local and keep the client's address (they are in the -LOCAL sets, so not
// masqueraded); when the node has no endpoint of the service, they fall
// back to the cluster's endpoints, so that pods on this node can still
// reach the service through those addresses (kubernetes#97081), while a
// well-behaved load balancer sends this node nothing, its health check
// failing. Topology hints and the fallback to serving, terminating
// endpoints come from changetracker.CategorizeEndpoints.
//
// The node needs net.ipv4.vs.conntrack=1 (kernel.SysctlVSConntrack), for
// the masquerading rules to see IPVS connections, and forwarding on;
// setting sysctls is the caller's job.
//
// A Writer is not safe for concurrent use.
type Writer struct {
	cfg         WriterConfig
	isIPv6      bool
	loopback    string // "127.0.0.0/8" or "::1/128"
	mark        string // "0x00004000"
	markMask    string // "0x00004000/0x00004000"
	nodeIPs     []netip.Addr
	nodePortIPs []netip.Addr
	// nodePortPrefixes are the family's node-port prefixes, nil for all
	// addresses; nodePortDst the same as strings, for the jump to
	// KUBE-NODE-PORT.
	nodePortPrefixes []netip.Prefix
	nodePortDst      []string
	setNames         [numSets]string
	modeNames        *Names
	jumps            []iptables.JumpRule

	// local tells local traffic, of the last Sync's pod ranges.
	local proxy.LocalDetector

	// Buffers reused from call to call.
	names    []changetracker.ServicePortName
	services []ipvs.Service
	reals    []ipvs.RealServer
	entries  [numSets][]ipset.Entry
	sets     []ipset.Desired
	owners   map[vsKey]changetracker.ServicePortName
	bound    map[netip.Addr]struct{}
	loops    map[ipset.Entry]struct{}
	buf      iptables.LineBuffer
}

// NewWriter returns a translator for cfg. It fails, naming the field,
// when the family is unknown, the chain prefix is not valid
// (NewNames), the masquerade bit is out of range, the scheduler or
// flags are unknown to IPVS, or Node has two cluster CIDRs of the family.
// cfg is copied; the translator never changes the caller's slices.
func NewWriter(cfg WriterConfig) (*Writer, error) {
	t := &Writer{cfg: cfg, owners: map[vsKey]changetracker.ServicePortName{}, bound: map[netip.Addr]struct{}{}, loops: map[ipset.Entry]struct{}{}}
	switch cfg.Family {
	case v1.IPv4Protocol:
		t.loopback = "127.0.0.0/8"
	case v1.IPv6Protocol:
		t.isIPv6, t.loopback = true, "::1/128"
	default:
		return nil, fmt.Errorf("IPVS translator: unknown IP family %q", cfg.Family)
	}
	names, err := NewNames(cfg.ChainPrefix)
	if err != nil {
		return nil, fmt.Errorf("IPVS translator: %w", err)
	}
	t.modeNames, t.jumps = names, names.JumpRules()
	bit, err := cfg.Node.MasqueradeMark()
	if err != nil {
		return nil, fmt.Errorf("IPVS translator: Node.MasqueradeBit: %w", err)
	}
	t.mark = fmt.Sprintf("%#08x", uint32(1)<<bit)
	t.markMask = t.mark + "/" + t.mark
	if cfg.SchedulerFlags&ipvs.FlagPersistent != 0 {
		return nil, fmt.Errorf("IPVS translator: %w: scheduler flags %#x: persistence comes from session affinity", ipvs.ErrInvalid, uint32(cfg.SchedulerFlags))
	}
	probe := ipvs.VirtualServer{Address: netip.IPv6Loopback(), Protocol: v1.ProtocolTCP, Port: 1, Scheduler: cfg.Scheduler, Flags: cfg.SchedulerFlags}
	if err := probe.Validate(); err != nil {
		return nil, fmt.Errorf("IPVS translator: scheduler %q with flags %#x: %w", cfg.Scheduler, uint32(cfg.SchedulerFlags), err)
	}
	if t.local, err = cfg.Node.LocalDetector(cfg.Family, nil); err != nil {
		return nil, fmt.Errorf("IPVS translator: Node.%w", err)
	}
	all := false
	for _, p := range cfg.Node.NodePortPrefixes(cfg.Family) {
		t.nodePortPrefixes = append(t.nodePortPrefixes, p)
		all = all || p.Bits() == 0
	}
	if all {
		t.nodePortPrefixes = nil
	}
	if cfg.Node.NodePortPrimary {
		// The node's own addresses, which the inputs give: none before.
		t.nodePortPrefixes = []netip.Prefix{}
	}
	t.setNodePortDst()
	for k := range numSets {
		t.setNames[k] = t.modeNames.setName(k, cfg.Family)
	}
	return t, nil
}

// setNodePortDst fills nodePortDst from nodePortPrefixes: nil for every
// local address, and never nil for the node's own (NodePortPrimary), so
// that a node without an address of the family serves no node port.
func (t *Writer) setNodePortDst() {
	t.nodePortDst = nil
	if t.cfg.Node.NodePortPrimary {
		t.nodePortDst = make([]string, 0, len(t.nodePortPrefixes))
	}
	for _, p := range t.nodePortPrefixes {
		t.nodePortDst = append(t.nodePortDst, p.String())
	}
}

// setNodeIPs takes the node's addresses of a sync's input, in their
// order, those of the other family and invalid ones left out. With
// NodePortPrimary, node ports follow them.
func (t *Writer) setNodeIPs(ips []netip.Addr) {
	t.nodeIPs, t.nodePortIPs = t.nodeIPs[:0], t.nodePortIPs[:0]
	if t.cfg.Node.NodePortPrimary {
		t.nodePortPrefixes = []netip.Prefix{}
		for _, ip := range ips {
			if ip, ok := t.own(ip); ok && !ip.IsLoopback() {
				t.nodePortPrefixes = append(t.nodePortPrefixes, netip.PrefixFrom(ip, ip.BitLen()))
			}
		}
		t.setNodePortDst()
	}
	for _, ip := range ips {
		ip, ok := t.own(ip)
		if !ok || slices.Contains(t.nodeIPs, ip) {
			continue
		}
		t.nodeIPs = append(t.nodeIPs, ip)
		if ip.IsLoopback() {
			continue
		}
		if t.nodePortPrefixes == nil || slices.ContainsFunc(t.nodePortPrefixes, func(p netip.Prefix) bool { return p.Contains(ip) }) {
			t.nodePortIPs = append(t.nodePortIPs, ip)
		}
	}
}

func (t *Writer) sameFamily(ip netip.Addr) bool {
	ip = ip.Unmap()
	return ip.IsValid() && ip.Is6() == t.isIPv6
}

// Translate renders in. in.NodeIPs are the node's own addresses, on its
// real interfaces (not the dummy interface; see
// ipvs.DummyBinder.HostAddresses): node ports get a virtual server on
// each of them (see WriterConfig.Node), an external IP or load-balancer
// VIP that is one of them is not bound to the dummy interface, since the
// node has it already, and a load balancer whose source ranges contain
// one of them also admits traffic whose source is the VIP itself, which
// is what the node sends when it reaches the VIP. Every call renders
// everything; the change results in in are not read.
//
// Bad input is logged through the logger in ctx and
// skipped for the service port it belongs to alone, never panicking: a
// port whose cluster IP is not of the family, or whose protocol, port,
// node port, health-check node port or affinity timeout is out of range,
// is skipped; endpoints and addresses of the other family, or with bad
// ports, are left out; a virtual server that an earlier service port (in
// name order) has already is left to that port.
func (t *Writer) Sync(ctx context.Context, in *proxy.FamilyInput) SyncResult {
	logger := klog.FromContext(ctx)
	res := SyncResult{Family: t.cfg.Family, JumpRules: t.jumps}
	if in.Family != "" && in.Family != t.cfg.Family {
		logger.Error(nil, "Input of another IP family; its service ports get no virtual servers", "ipFamily", t.cfg.Family, "inputFamily", logsafe.Quote(string(in.Family)))
	}
	t.setNodeIPs(in.NodeIPs)
	// Every sync is whole: the detector of the node's pod range now.
	if d, err := t.cfg.Node.LocalDetector(t.cfg.Family, in.PodCIDRs); err == nil {
		t.local = d
	}

	t.names = t.names[:0]
	endpoints := 0
	for name := range in.Services {
		t.names = append(t.names, name)
		endpoints += len(in.Endpoints[name])
	}
	slices.SortFunc(t.names, compareServicePortNames)

	// Each port uses at most two lists of real servers, one per traffic
	// policy; room for both means the arena is allocated once.
	if cap(t.reals) < 2*endpoints {
		t.reals = make([]ipvs.RealServer, 0, 2*endpoints)
	}
	t.reals = t.reals[:0]
	t.services = t.services[:0]
	for k := range t.entries {
		t.entries[k] = t.entries[k][:0]
	}
	clear(t.owners)
	clear(t.bound)
	clear(t.loops)

	for _, name := range t.names {
		if t.translatePort(logger, name, in.Services[name], in.Endpoints[name], in.NodeLabels, &res) {
			res.ServicePorts++
		} else {
			res.SkippedServicePorts++
		}
	}

	t.sets = t.sets[:0]
	for k := range numSets {
		t.sets = append(t.sets, ipset.Desired{Set: setDesc(k, t.setNames[k], t.cfg.Family, len(t.entries[k])), Entries: t.entries[k]})
	}
	t.render()

	res.Services = t.services
	res.Sets = t.sets
	res.Payload = t.buf.Bytes()
	res.Lines = t.buf.Lines()
	logger.V(2).Info("Translated services for IPVS mode", "ipFamily", t.cfg.Family,
		"servicePorts", res.ServicePorts, "skipped", res.SkippedServicePorts,
		"virtualServers", len(res.Services), "payloadBytes", len(res.Payload))
	return res
}

// translatePort adds what one service port needs and reports whether it
// was usable.
func (t *Writer) translatePort(logger klog.Logger, name changetracker.ServicePortName, svc changetracker.ServicePort, eps []changetracker.Endpoint, labels map[string]string, res *SyncResult) bool {
	if svc == nil {
		return false
	}
	skip := func(why string, kv ...any) bool {
		logger.Error(nil, "Skipping service port: "+why, append([]any{"servicePort", name.String(), "ipFamily", t.cfg.Family}, kv...)...)
		return false
	}
	clusterIP, ok := t.own(svc.ClusterIP())
	if !ok {
		return skip("cluster IP is not of the translator's family", "clusterIP", svc.ClusterIP())
	}
	proto := svc.Protocol()
	if proto != v1.ProtocolTCP && proto != v1.ProtocolUDP && proto != v1.ProtocolSCTP {
		return skip("protocol is not TCP, UDP or SCTP", "protocol", proto)
	}
	port, nodePort, hcPort := svc.Port(), svc.NodePort(), svc.HealthCheckNodePort()
	if port < 1 || port > math.MaxUint16 || nodePort < 0 || nodePort > math.MaxUint16 || hcPort < 0 || hcPort > math.MaxUint16 {
		return skip("port out of range", "port", port, "nodePort", nodePort, "healthCheckNodePort", hcPort)
	}
	vs := ipvs.VirtualServer{Protocol: proto, Port: uint16(port), Scheduler: t.cfg.Scheduler, Flags: t.cfg.SchedulerFlags}
	if svc.SessionAffinityType() == v1.ServiceAffinityClientIP {
		timeout := svc.StickyMaxAgeSeconds()
		if timeout < 1 || timeout > math.MaxInt32 {
			return skip("ClientIP affinity timeout out of range", "timeoutSeconds", timeout)
		}
		vs.Flags |= ipvs.FlagPersistent
		vs.Timeout = uint32(timeout)
	}

	cluster, local, _, hasAny := changetracker.CategorizeEndpoints(eps, svc, t.cfg.Node.Name, labels)
	internal := cluster
	if svc.InternalPolicyLocal() {
		internal = local
		if hasAny && len(local) == 0 {
			res.NoLocalEndpointsInternal++
		}
	}
	external := cluster
	localPolicy := svc.ExternalPolicyLocal()
	if localPolicy {
		if len(local) > 0 {
			external = local
		} else if hasAny {
			res.NoLocalEndpointsExternal++
		}
	}
	internalRS := t.realServers(logger, name, internal)
	externalRS := internalRS
	if !sameEndpoints(internal, external) {
		externalRS = t.realServers(logger, name, external)
	}

	// Cluster IP.
	vs.Address = clusterIP
	t.addService(logger, name, vs, internalRS, true)
	t.add(setClusterIP, ipset.IPPortEntry(clusterIP, proto, vs.Port))
	// A local endpoint that reaches itself through the service must be
	// masqueraded, or it would see its own address as the source.
	// A pod behind several services is listed once.
	for _, ep := range eps {
		if !ep.IsLocal() {
			continue
		}
		if ip, p, ok := t.endpointAddr(ep); ok {
			e := ipset.IPPortIPEntry(ip, proto, p, ip)
			if _, dup := t.loops[e]; !dup {
				t.loops[e] = struct{}{}
				t.add(setLoopBack, e)
			}
		}
	}

	// External IPs.
	extSet := setExternalIP
	if localPolicy {
		extSet = setExternalIPLocal
	}
	for _, ip := range svc.ExternalIPs() {
		if ip, ok := t.addExternal(logger, name, vs, ip, externalRS); ok {
			t.add(extSet, ipset.IPPortEntry(ip, proto, vs.Port))
		}
	}

	// Load-balancer VIPs, with their source ranges. A range of length 0
	// admits everyone (and cannot be an ipset member), so it turns the
	// firewall off.
	ranges := svc.LoadBalancerSourceRanges()
	firewall := false
	for _, r := range ranges {
		if t.ownPrefix(r) {
			firewall = true
			if r.Bits() == 0 {
				firewall = false
				break
			}
		}
	}
	for _, vip := range svc.LoadBalancerVIPs() {
		vip, ok := t.addExternal(logger, name, vs, vip, externalRS)
		if !ok {
			continue
		}
		e := ipset.IPPortEntry(vip, proto, vs.Port)
		t.add(setLoadBalancer, e)
		if localPolicy {
			t.add(setLoadBalancerLocal, e)
		}
		if !firewall {
			continue
		}
		t.add(setLoadBalancerFW, e)
		fromNode := false
		for _, r := range ranges {
			if !t.ownPrefix(r) {
				continue
			}
			t.add(setLoadBalancerSourceCIDR, ipset.IPPortNetEntry(vip, proto, vs.Port, r))
			fromNode = fromNode || slices.ContainsFunc(t.nodeIPs, r.Contains)
		}
		if fromNode {
			t.add(setLoadBalancerSourceIP, ipset.IPPortIPEntry(vip, proto, vs.Port, vip))
		}
	}

	// Node ports, on each node-port address.
	if nodePort > 0 && len(t.nodePortIPs) > 0 {
		vs.Port = uint16(nodePort)
		for _, ip := range t.nodePortIPs {
			vs.Address = ip
			t.addService(logger, name, vs, externalRS, false)
		}
		switch proto {
		case v1.ProtocolTCP:
			t.addNodePort(setNodePortTCP, setNodePortLocalTCP, localPolicy, ipset.PortEntry(vs.Port))
		case v1.ProtocolUDP:
			t.addNodePort(setNodePortUDP, setNodePortLocalUDP, localPolicy, ipset.PortEntry(vs.Port))
		case v1.ProtocolSCTP:
			for _, ip := range t.nodePortIPs {
				t.addNodePort(setNodePortSCTP, setNodePortLocalSCTP, localPolicy, ipset.IPPortEntry(ip, proto, vs.Port))
			}
		}
	}
	if hcPort > 0 {
		t.add(setHealthCheckNodePort, ipset.PortEntry(uint16(hcPort)))
	}
	return true
}

func (t *Writer) add(k setKind, e ipset.Entry) { t.entries[k] = append(t.entries[k], e) }

func (t *Writer) addNodePort(all, local setKind, localPolicy bool, e ipset.Entry) {
	t.add(all, e)
	if localPolicy {
		t.add(local, e)
	}
}

// addExternal adds the virtual server of vs's port on an external IP or
// load-balancer VIP, bound unless it is the node's own, and returns the
// address in the kernel's form, or false if it is not of the family.
func (t *Writer) addExternal(logger klog.Logger, name changetracker.ServicePortName, vs ipvs.VirtualServer, ip netip.Addr, rs []ipvs.RealServer) (netip.Addr, bool) {
	ip, ok := t.own(ip)
	if ok {
		vs.Address = ip
		t.addService(logger, name, vs, rs, !t.isNodeIP(ip))
	}
	return ip, ok
}

// addService adds a virtual server unless an earlier service port has it:
// the kernel has one virtual server per address, protocol and port.
func (t *Writer) addService(logger klog.Logger, name changetracker.ServicePortName, vs ipvs.VirtualServer, rs []ipvs.RealServer, bind bool) {
	k := keyOf(vs)
	if owner, taken := t.owners[k]; taken {
		logger.Error(nil, "Skipping virtual server: another service port has it", "virtualServer", vs.String(), "servicePort", name.String(), "owner", owner.String())
		return
	}
	t.owners[k] = name
	t.services = append(t.services, ipvs.Service{VirtualServer: vs, RealServers: rs, Bind: bind})
	if !bind {
		return
	}
	if _, done := t.bound[vs.Address]; !done {
		t.bound[vs.Address] = struct{}{}
		t.add(setIPVSIPs, ipset.IPEntry(vs.Address))
	}
}

// realServers converts eps into real servers in the arena and returns
// them, or nil if none is usable.
func (t *Writer) realServers(logger klog.Logger, name changetracker.ServicePortName, eps []changetracker.Endpoint) []ipvs.RealServer {
	start := len(t.reals)
	for _, ep := range eps {
		ip, port, ok := t.endpointAddr(ep)
		if !ok {
			logger.Error(nil, "Skipping endpoint: address not of the translator's family or port out of range", "servicePort", name.String(), "ip", ep.IP(), "port", ep.Port(), "ipFamily", t.cfg.Family)
			continue
		}
		// The map keeps endpoints sorted, so a repeat is the previous one.
		if n := len(t.reals); n > start && t.reals[n-1].Address == ip && t.reals[n-1].Port == port {
			continue
		}
		t.reals = append(t.reals, ipvs.RealServer{Address: ip, Port: port, Weight: 1})
	}
	if len(t.reals) == start {
		return nil
	}
	end := len(t.reals)
	return t.reals[start:end:end]
}

func (t *Writer) endpointAddr(ep changetracker.Endpoint) (netip.Addr, uint16, bool) {
	ip, ok := t.own(ep.IP())
	port := ep.Port()
	return ip, uint16(port), ok && port > 0 && port <= math.MaxUint16
}

// own returns ip in the form the kernel takes (not IPv4-mapped, no zone)
// and whether it is a valid address of the translator's family.
func (t *Writer) own(ip netip.Addr) (netip.Addr, bool) {
	ip = ip.Unmap().WithZone("")
	return ip, t.sameFamily(ip)
}

// ownPrefix reports whether p is a valid prefix of the translator's
// family, in the form the kernel takes.
func (t *Writer) ownPrefix(p netip.Prefix) bool {
	a := p.Addr()
	return p.IsValid() && a.Zone() == "" && !a.Is4In6() && a.Is6() == t.isIPv6
}

func (t *Writer) isNodeIP(ip netip.Addr) bool { return slices.Contains(t.nodeIPs, ip) }

// sameEndpoints reports whether a and b are the same slice.
func sameEndpoints(a, b []changetracker.Endpoint) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

func compareServicePortNames(a, b changetracker.ServicePortName) int {
	return cmp.Or(
		strings.Compare(a.Namespace, b.Namespace),
		strings.Compare(a.Name, b.Name),
		strings.Compare(a.Port, b.Port),
		strings.Compare(string(a.Protocol), string(b.Protocol)),
	)
}

// WriteTo writes tr to w in a form for people, such as a proxier's dry
// run prints: the virtual servers as ipvsadm lists them ("TCP
// 10.96.0.1:443 rr persistent 10800 bound", then "  -> 10.244.1.5:6443
// weight 1" per real server), the sets as `ipset save` writes them, then
// Payload, each part after a "#" heading that names it and the family.
// Nothing is sorted: the order is tr's.
func (tr SyncResult) WriteTo(w io.Writer) (int64, error) {
	var b []byte
	b = fmt.Appendf(b, "# IPVS virtual servers (%s)\n", tr.Family)
	for _, s := range tr.Services {
		vs := s.VirtualServer.Normalized()
		b = fmt.Appendf(b, "%s %s %s", vs.Protocol, netip.AddrPortFrom(vs.Address, vs.Port), vs.Scheduler)
		if vs.Flags&ipvs.FlagPersistent != 0 {
			b = fmt.Appendf(b, " persistent %d", vs.Timeout)
		}
		if f := vs.Flags &^ ipvs.FlagPersistent; f != 0 {
			b = fmt.Appendf(b, " flags %#x", uint32(f))
		}
		if s.Bind {
			b = append(b, " bound"...)
		}
		b = append(b, '\n')
		for _, rs := range s.RealServers {
			b = fmt.Appendf(b, "  -> %s weight %d\n", rs, rs.Weight)
		}
	}
	b = fmt.Appendf(b, "# ipsets (%s)\n", tr.Family)
	for _, d := range tr.Sets {
		b = fmt.Appendf(b, "create %s\n", d.Set.WithDefaults())
		for _, e := range d.Entries {
			b = fmt.Appendf(b, "add %s %s\n", d.Set.Name, e)
		}
	}
	restore := "iptables-restore"
	if tr.Family == v1.IPv6Protocol {
		restore = "ip6tables-restore"
	}
	b = fmt.Appendf(b, "# %s input (%s)\n", restore, tr.Family)
	b = append(b, tr.Payload...)
	n, err := w.Write(b)
	return int64(n), err
}

// vsKey is a virtual server's identity (see ipvs.VirtualServer.SameAs),
// without pointers, so that a map of tens of thousands of them costs the
// garbage collector nothing.
type vsKey struct {
	addr  [16]byte
	proto v1.Protocol
	port  uint16
}

func keyOf(vs ipvs.VirtualServer) vsKey {
	return vsKey{vs.Address.As16(), vs.Protocol, vs.Port}
}
