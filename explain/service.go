package explain

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/logsafe"
	"github.com/proxykit/proxykit/proxier/config"
)

// NodeInfo is the node a service report is made for, as the proxy on it
// sees it.
type NodeInfo struct {
	// Name is the node's name (--hostname-override): endpoints with this
	// nodeName are local.
	Name string
	// Labels are the Node object's labels; topology.kubernetes.io/zone
	// decides which zone hints apply. nil when the Node could not be read.
	Labels map[string]string
	// Addresses are the node's IPs, primary first. A Service whose cluster
	// IP is one of them is refused, as the trackers refuse it.
	Addresses []netip.Addr
}

// ProxySettings are the settings of the proxy that decide what it serves.
type ProxySettings struct {
	// ServiceProxyName is the service.kubernetes.io/service-proxy-name
	// value the proxy serves; empty for the default proxy, which serves
	// the Services without the label.
	ServiceProxyName string
	// Families are the IP families the proxy runs, primary first. Empty
	// means the families of NodeInfo.Addresses, or IPv4 alone when the
	// node has none.
	Families []v1.IPFamily
}

// ServiceInput is what ExplainService reads.
type ServiceInput struct {
	// Service is the Service to explain; required.
	Service *v1.Service
	// Slices are the EndpointSlices of the Service's namespace, or at least
	// those of the Service and those that look like its own without its
	// kubernetes.io/service-name label (see SliceReport); slices of other
	// Services are left out of the report.
	Slices []*discoveryv1.EndpointSlice
	Node   NodeInfo
	Proxy  ProxySettings
	// Port limits the report to the Service ports with this name or
	// number; empty means every port.
	Port string
}

// EndpointReason says why an endpoint is or is not used. The empty
// EndpointReason is a ready endpoint that is used.
type EndpointReason string

// The reasons of an EndpointVerdict.
const (
	// ReasonNotReady: the endpoint is not ready and not terminating.
	ReasonNotReady EndpointReason = "NotReady"
	// ReasonNotServing: the endpoint is terminating and no longer serving,
	// so it is not even a fallback.
	ReasonNotServing EndpointReason = "TerminatingNotServing"
	// ReasonTerminating: the endpoint is terminating but serving, and not
	// used because ready endpoints exist for the traffic.
	ReasonTerminating EndpointReason = "Terminating"
	// ReasonTerminatingFallback: the endpoint is terminating but serving and
	// used, because no endpoint is ready for the traffic (EndpointVerdict.Used and
	// EndpointVerdict.Fallback are set).
	ReasonTerminatingFallback EndpointReason = "TerminatingFallback"
	// ReasonTopology: the endpoint is ready but topology hints send this
	// node's Cluster traffic to other endpoints (another zone or node).
	ReasonTopology EndpointReason = "TopologyHints"
	// ReasonNotLocal: the traffic has policy Local and the endpoint is on
	// another node.
	ReasonNotLocal EndpointReason = "NotLocal"
	// ReasonPortName: the endpoint's slice has no port with the Service
	// port's name and protocol, so the tracker files its endpoints under
	// another port name.
	ReasonPortName EndpointReason = "PortNameMismatch"
	// ReasonSliceUnlabelled: the slice has no kubernetes.io/service-name
	// label, so no proxy can tell which Service it belongs to.
	ReasonSliceUnlabelled EndpointReason = "SliceWithoutServiceName"
	// ReasonSliceHeadless: the slice carries service.kubernetes.io/headless,
	// and proxies do not watch such slices.
	ReasonSliceHeadless EndpointReason = "SliceHeadless"
	// ReasonSliceRefused: the tracker refused the slice, or its port, as
	// invalid; EndpointVerdict.Detail is the tracker's log line.
	ReasonSliceRefused EndpointReason = "SliceRefused"
	// ReasonEndpointRefused: the tracker refused the endpoint's address;
	// EndpointVerdict.Detail is the tracker's log line.
	ReasonEndpointRefused EndpointReason = "EndpointRefused"
	// ReasonOtherFamily: the endpoint is of an IP family the proxy does not
	// serve the Service in.
	ReasonOtherFamily EndpointReason = "OtherFamily"
	// ReasonDuplicate: another slice lists the same address and port, and
	// the tracker kept that copy.
	ReasonDuplicate EndpointReason = "Duplicate"
	// ReasonUnexplained: CategorizeEndpoints left the endpoint out for a
	// reason none of the others names; the view lags behind the tracker.
	ReasonUnexplained EndpointReason = "Unexplained"
	// ReasonServiceNotProxied: the proxy does not serve this Service port
	// (see PortReport.NotProxied).
	ReasonServiceNotProxied EndpointReason = "ServiceNotProxied"
)

// ServiceReport is the service view: what the proxy on one node makes of
// one Service and its EndpointSlices. Text in it comes from the API
// unescaped: WriteText and WriteJSON escape it.
type ServiceReport struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Type      string `json:"type"`
	Node      string `json:"node"`
	Zone      string `json:"zone,omitempty"`
	// Families are the families the proxy runs.
	Families []v1.IPFamily `json:"proxyFamilies"`
	// Proxied is whether the proxy serves at least one port of the
	// Service in one family.
	Proxied bool `json:"proxied"`
	// NotProxied says why the proxy leaves out the whole Service (another
	// proxy's, headless, ExternalName, refused as invalid, ...).
	NotProxied []string `json:"notProxied,omitempty"`
	// Notes are other facts worth knowing: no selector, addresses the
	// tracker ignored, ...
	Notes  []string      `json:"notes,omitempty"`
	Slices []SliceReport `json:"slices"`
	Ports  []PortReport  `json:"ports"`
}

// SliceReport is one EndpointSlice the report looked at: those labelled
// kubernetes.io/service-name=<the Service>, and those without that label
// that look like the Service's own (an owner reference to it, or a name or
// generateName starting with "<name>-").
type SliceReport struct {
	Name        string `json:"name"`
	AddressType string `json:"addressType"`
	// Used is whether the tracker took the slice in.
	Used   bool           `json:"used"`
	Reason EndpointReason `json:"reason,omitempty"`
	Detail string         `json:"detail,omitempty"`
}

// PortReport is one port of the Service in one IP family.
type PortReport struct {
	Name       string      `json:"name"`
	Port       int32       `json:"port"`
	Protocol   v1.Protocol `json:"protocol"`
	TargetPort string      `json:"targetPort,omitempty"`
	NodePort   int32       `json:"nodePort,omitempty"`
	Family     v1.IPFamily `json:"family"`
	// Proxied is whether the tracker holds the port in this family.
	Proxied    bool   `json:"proxied"`
	NotProxied string `json:"notProxied,omitempty"`
	// InternalPolicy is the policy of traffic to the cluster IP, Cluster or
	// Local; ExternalPolicy that of node ports, external IPs and
	// load-balancer VIPs, empty when the port is not reachable from
	// outside.
	InternalPolicy string `json:"internalPolicy,omitempty"`
	ExternalPolicy string `json:"externalPolicy,omitempty"`
	// Topology is the hint kind CategorizeEndpoints follows for Cluster
	// traffic on this node (see changetracker.ClusterTopology); empty
	// when hints are ignored.
	Topology string `json:"topology,omitempty"`
	// HasAnyEndpoints is CategorizeEndpoints' answer: some endpoint is
	// usable somewhere in the cluster (a proxy rejects traffic when not,
	// and drops traffic it has no local endpoint for when so).
	HasAnyEndpoints bool             `json:"hasAnyEndpoints"`
	WaysIn          []WayIn          `json:"waysIn,omitempty"`
	Endpoints       []EndpointReport `json:"endpoints"`
}

// WayIn is one way traffic reaches a port, to be traced in the kernel.
type WayIn struct {
	// Kind is ClusterIP, NodePort, ExternalIP or LoadBalancer.
	Kind string `json:"kind"`
	// IP is the destination address; the zero Addr for NodePort, which is
	// served on the node-port addresses of the node.
	IP       netip.Addr  `json:"ip,omitzero"`
	Port     int         `json:"port"`
	Protocol v1.Protocol `json:"protocol"`
	// Policy is the traffic policy, Cluster or Local.
	Policy string `json:"policy"`
	// Endpoints are the "ip:port" of the endpoints the tracker gives this
	// traffic on this node; empty when it has none.
	Endpoints []string `json:"endpoints"`
	// Traces are this way in traced through the node's rules, once
	// ServiceReport.TraceWaysIn has run.
	Traces []WayTrace `json:"traces,omitempty"`
}

// The kinds of WayIn.
const (
	WayClusterIP    = "ClusterIP"
	WayNodePort     = "NodePort"
	WayExternalIP   = "ExternalIP"
	WayLoadBalancer = "LoadBalancer"
)

// EndpointReport is one endpoint of a slice, for one Service port.
type EndpointReport struct {
	Slice string `json:"slice"`
	// Address is the endpoint's first address, as the slice lists it.
	Address string `json:"address"`
	// Port is the slice port's number for the Service port; 0 when the
	// slice has none.
	Port        int32    `json:"port,omitempty"`
	NodeName    string   `json:"nodeName,omitempty"`
	Zone        string   `json:"zone,omitempty"`
	Ready       bool     `json:"ready"`
	Serving     bool     `json:"serving"`
	Terminating bool     `json:"terminating"`
	ZoneHints   []string `json:"zoneHints,omitempty"`
	NodeHints   []string `json:"nodeHints,omitempty"`
	// Internal is the verdict for traffic to the cluster IP; External for
	// traffic from outside, nil when the port is not reachable from
	// outside.
	Internal EndpointVerdict  `json:"internal"`
	External *EndpointVerdict `json:"external,omitempty"`
}

// EndpointVerdict is whether one kind of traffic uses an endpoint on this node,
// and why.
type EndpointVerdict struct {
	Used bool `json:"used"`
	// Fallback: used although terminating, as no endpoint is ready.
	Fallback bool           `json:"fallback,omitempty"`
	Reason   EndpointReason `json:"reason,omitempty"`
	// Detail says it in words, with the tracker's own log line for a
	// refusal.
	Detail string `json:"detail,omitempty"`
}

// ErrNoSuchPort is returned by ExplainService when ServiceInput.Port names
// no port of the Service.
var ErrNoSuchPort = errors.New("no such port")

// ExplainService says, for every port of in.Service (or in.Port alone)
// and every IP family the proxy serves it in, which endpoints of its
// slices the proxy on in.Node uses and why each other one is left out.
// The verdicts are the trackers' own: it feeds the objects to a
// changetracker.ServiceChangeTracker and EndpointsChangeTracker per
// family, as a proxy's informers would (after kube-proxy's informer
// selectors, config.ServiceLabelSelector and the others), and calls
// changetracker.CategorizeEndpoints; refusals are the trackers' log lines.
// It reads no kernel state and changes nothing. It fails only for a nil
// Service or a Port that names none of its ports (ErrNoSuchPort).
func ExplainService(in ServiceInput) (*ServiceReport, error) {
	svc := in.Service
	if svc == nil {
		return nil, errors.New("no Service")
	}
	specPorts := selectPorts(svc.Spec.Ports, in.Port)
	if in.Port != "" && len(specPorts) == 0 {
		return nil, fmt.Errorf("service %s has no port %s: %w", logsafe.KObj(svc), logsafe.Quote(in.Port), ErrNoSuchPort)
	}
	nn := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	families := proxyFamilies(in.Proxy.Families, in.Node.Addresses)
	r := &ServiceReport{
		Namespace: svc.Namespace,
		Name:      svc.Name,
		Type:      string(svc.Spec.Type),
		Node:      in.Node.Name,
		Zone:      in.Node.Labels[v1.LabelTopologyZone],
		Families:  families,
	}
	if r.Type == "" {
		r.Type = string(v1.ServiceTypeClusterIP)
	}
	watched := serviceWatched(r, svc, in.Proxy.ServiceProxyName)
	if svc.Spec.Selector == nil && svc.Spec.Type != v1.ServiceTypeExternalName {
		r.Notes = svcAppendOnce(r.Notes, "no selector: the EndpointSlice controller writes no slices for it; its slices are whatever someone else labels kubernetes.io/service-name="+svc.Name)
	}

	cands := svcCandidateSlices(svc, in.Slices)
	fams := make([]*familyState, 0, len(families))
	for _, f := range families {
		fams = append(fams, feedTrackers(f, nn, svc, watched, cands, in.Node))
	}
	r.Slices = sliceReports(cands, fams)

	// The families the report is about: the Service's that the proxy
	// runs. A family of the proxy that the Service lacks is left out,
	// with the tracker's "no cluster IP of family" line.
	svcFamilies := serviceFamilies(svc)
	if len(svcFamilies) == 0 {
		// Headless or ExternalName without addresses: any family says
		// the same.
		svcFamilies = families
	}
	var reportFams []*familyState
	for _, fs := range fams {
		if slices.Contains(svcFamilies, fs.family) {
			reportFams = append(reportFams, fs)
		}
	}
	if len(reportFams) == 0 {
		// Say it in the Service's family, whose slices then show.
		reportFams = []*familyState{{family: svcFamilies[0], notRun: true}}
		r.NotProxied = svcAppendOnce(r.NotProxied, fmt.Sprintf("the proxy runs %s only and the Service is %s only", familyList(families), familyList(svcFamilies)))
	}
	for _, fs := range reportFams {
		for _, l := range fs.svcLogs {
			switch {
			case l.kv["portName"] != "":
				// Reported with the port.
			case l.msg == "Ignoring invalid service" || l.msg == "Skipping service for this IP family":
				r.NotProxied = svcAppendOnce(r.NotProxied, l.text())
			default:
				r.Notes = svcAppendOnce(r.Notes, l.text())
			}
		}
	}
	if len(svc.Spec.Ports) == 0 {
		r.NotProxied = svcAppendOnce(r.NotProxied, "the Service has no ports")
	}
	shown := map[v1.IPFamily]bool{}
	for _, fs := range reportFams {
		shown[fs.family] = true
	}
	for i := range specPorts {
		for _, fs := range reportFams {
			pr := portReport(&specPorts[i], fs, nn, cands, shown, in.Node)
			r.Proxied = r.Proxied || pr.Proxied
			r.Ports = append(r.Ports, pr)
		}
	}
	return r, nil
}

// selectPorts returns the ports named (by name or number) by want, or all
// of them when want is empty.
func selectPorts(ports []v1.ServicePort, want string) []v1.ServicePort {
	if want == "" {
		return ports
	}
	var out []v1.ServicePort
	for _, p := range ports {
		if p.Name == want || strconv.Itoa(int(p.Port)) == want {
			out = append(out, p)
		}
	}
	return out
}

// proxyFamilies is ProxySettings.Families, completed as its godoc says.
func proxyFamilies(set []v1.IPFamily, addrs []netip.Addr) []v1.IPFamily {
	if len(set) > 0 {
		return slices.Clone(set)
	}
	var out []v1.IPFamily
	for _, a := range addrs {
		if f := svcFamilyOfAddr(a); !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		out = []v1.IPFamily{v1.IPv4Protocol}
	}
	return out
}

func svcFamilyOfAddr(a netip.Addr) v1.IPFamily {
	if a.Unmap().Is4() {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}

// serviceFamilies returns the Service's families: spec.ipFamilies, else
// those of its cluster IPs; none when it has neither.
func serviceFamilies(svc *v1.Service) []v1.IPFamily {
	var out []v1.IPFamily
	for _, f := range svc.Spec.IPFamilies {
		if (f == v1.IPv4Protocol || f == v1.IPv6Protocol) && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	if len(out) > 0 {
		return out
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	for _, s := range ips {
		if ip, err := netip.ParseAddr(s); err == nil {
			if f := svcFamilyOfAddr(ip); !slices.Contains(out, f) {
				out = append(out, f)
			}
		}
	}
	return out
}

func familyList(fs []v1.IPFamily) string {
	s := make([]string, len(fs))
	for i, f := range fs {
		s[i] = string(f)
	}
	return strings.Join(s, " and ")
}

// serviceWatched reports whether the proxy's Service informer would list
// svc, with kube-proxy's selectors, and says in r why not.
func serviceWatched(r *ServiceReport, svc *v1.Service, proxyName string) bool {
	if !config.ServiceLabelSelector(proxyName).Matches(labels.Set(svc.Labels)) {
		owner, labelled := svc.Labels[config.ServiceProxyNameLabel]
		var why string
		switch {
		case labelled && proxyName == "":
			why = fmt.Sprintf("owned by another proxy: labelled %s=%s, and this proxy serves only Services without the label", config.ServiceProxyNameLabel, owner)
		case labelled:
			why = fmt.Sprintf("owned by another proxy: labelled %s=%s, and this proxy serves %s=%s", config.ServiceProxyNameLabel, owner, config.ServiceProxyNameLabel, proxyName)
		default:
			why = fmt.Sprintf("not labelled %s=%s, which this proxy serves", config.ServiceProxyNameLabel, proxyName)
		}
		r.NotProxied = append(r.NotProxied, why)
		return false
	}
	if !config.ServiceFieldSelector().Matches(fields.Set{"spec.clusterIP": svc.Spec.ClusterIP}) {
		r.NotProxied = append(r.NotProxied, "headless (clusterIP None): served by DNS, not by the proxy")
		return false
	}
	return true
}

// svcCandidate is one slice the report looks at.
type svcCandidate struct {
	slice *discoveryv1.EndpointSlice
	// unlabelled: no kubernetes.io/service-name label, taken for its
	// looks.
	unlabelled bool
	// headless: the proxies' slice selector leaves it out.
	headless bool
}

// svcCandidateSlices picks the slices of svc, and those that look like its
// own without the service-name label, sorted by name.
func svcCandidateSlices(svc *v1.Service, all []*discoveryv1.EndpointSlice) []svcCandidate {
	var out []svcCandidate
	for _, s := range all {
		if s == nil || s.Namespace != svc.Namespace {
			continue
		}
		owner, labelled := s.Labels[discoveryv1.LabelServiceName]
		c := svcCandidate{slice: s}
		switch {
		case labelled && owner != "":
			if owner != svc.Name {
				continue
			}
		case looksOwned(s, svc):
			c.unlabelled = true
		default:
			continue
		}
		c.headless = !config.EndpointSliceLabelSelector().Matches(labels.Set(s.Labels))
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b svcCandidate) int { return cmp.Compare(a.slice.Name, b.slice.Name) })
	return out
}

// looksOwned reports whether a slice without the service-name label looks
// like one of svc's: owned by it, or named after it.
func looksOwned(s *discoveryv1.EndpointSlice, svc *v1.Service) bool {
	for _, o := range s.OwnerReferences {
		if o.Kind == "Service" && o.Name == svc.Name {
			return true
		}
	}
	return strings.HasPrefix(s.Name, svc.Name+"-") || s.GenerateName == svc.Name+"-"
}

// familyState is what the trackers of one family made of the objects.
type familyState struct {
	family v1.IPFamily
	// notRun: the proxy does not run this family; the state is empty.
	notRun bool
	// watched: the Service informer lists the Service.
	watched bool
	ports   changetracker.ServicePortMap
	eps     changetracker.EndpointsMap
	svcLogs []trackerLog
	// sliceLogs holds the lines logged while each slice was fed.
	sliceLogs map[*discoveryv1.EndpointSlice][]trackerLog
}

// feedTrackers runs one family's trackers over the objects the proxy's
// informers would hand them.
func feedTrackers(family v1.IPFamily, nn types.NamespacedName, svc *v1.Service, watched bool, cands []svcCandidate, node NodeInfo) *familyState {
	fs := &familyState{family: family, watched: watched, ports: changetracker.ServicePortMap{}, eps: changetracker.EndpointsMap{}, sliceLogs: map[*discoveryv1.EndpointSlice][]trackerLog{}}
	if watched {
		logger, lines := newCapture()
		st := changetracker.NewServiceChangeTracker(family, nil, changetracker.WithLogger(logger), changetracker.WithNodeIPs(node.Addresses...))
		st.Update(nil, svc)
		fs.ports.Update(st)
		fs.svcLogs = *lines
	}
	logger, lines := newCapture()
	et := changetracker.NewEndpointsChangeTracker(family, node.Name, nil, changetracker.WithLogger(logger))
	for _, c := range cands {
		if c.headless {
			continue
		}
		start := len(*lines)
		et.EndpointSliceUpdate(c.slice, false)
		fs.sliceLogs[c.slice] = slices.Clone((*lines)[start:])
	}
	fs.eps.Update(et)
	// Only this Service's endpoints count: an unlabelled slice is refused,
	// never filed under another name.
	for name := range fs.eps {
		if name.NamespacedName != nn {
			delete(fs.eps, name)
		}
	}
	return fs
}

// sliceFamily returns the family of a slice's address type, or "" for FQDN
// and unknown types.
func sliceFamily(s *discoveryv1.EndpointSlice) v1.IPFamily {
	switch s.AddressType {
	case discoveryv1.AddressTypeIPv4:
		return v1.IPv4Protocol
	case discoveryv1.AddressTypeIPv6:
		return v1.IPv6Protocol
	}
	return ""
}

// sliceRefusal returns the tracker's line refusing the whole slice, if
// any.
func sliceRefusal(logs []trackerLog) (trackerLog, bool) {
	for _, l := range logs {
		if l.msg == "Ignoring invalid endpoint slice" {
			return l, true
		}
	}
	return trackerLog{}, false
}

func sliceReports(cands []svcCandidate, fams []*familyState) []SliceReport {
	out := make([]SliceReport, 0, len(cands))
	for _, c := range cands {
		sr := SliceReport{Name: c.slice.Name, AddressType: string(c.slice.AddressType)}
		fam := sliceFamily(c.slice)
		i := slices.IndexFunc(fams, func(fs *familyState) bool { return fs.family == fam })
		switch {
		case c.headless:
			sr.Reason, sr.Detail = ReasonSliceHeadless, "labelled "+v1.IsHeadlessService+": proxies do not watch it"
		case fam == "":
			sr.Reason, sr.Detail = ReasonOtherFamily, "address type "+string(c.slice.AddressType)+": proxies use only IPv4 and IPv6 slices"
		case i < 0:
			sr.Reason, sr.Detail = ReasonOtherFamily, fmt.Sprintf("the proxy does not run %s", fam)
		default:
			if l, refused := sliceRefusal(fams[i].sliceLogs[c.slice]); refused {
				sr.Reason, sr.Detail = ReasonSliceRefused, l.text()
				if c.unlabelled {
					sr.Reason = ReasonSliceUnlabelled
				}
			} else {
				sr.Used = true
			}
		}
		out = append(out, sr)
	}
	return out
}

// portReport explains one Service port in one family.
func portReport(sp *v1.ServicePort, fs *familyState, nn types.NamespacedName, cands []svcCandidate, shown map[v1.IPFamily]bool, node NodeInfo) PortReport {
	proto := sp.Protocol
	if proto == "" {
		proto = v1.ProtocolTCP
	}
	pr := PortReport{Name: sp.Name, Port: sp.Port, Protocol: proto, NodePort: sp.NodePort, Family: fs.family}
	if tp := sp.TargetPort.String(); tp != "0" && tp != "" {
		pr.TargetPort = tp
	}
	name := changetracker.ServicePortName{NamespacedName: nn, Port: sp.Name, Protocol: proto}
	svcPort, ok := fs.ports[name]
	switch {
	case ok:
		pr.Proxied = true
	case fs.notRun:
		pr.NotProxied = fmt.Sprintf("the proxy does not run %s", fs.family)
	case !fs.watched:
		pr.NotProxied = "the proxy does not watch the Service"
	default:
		pr.NotProxied = "the tracker does not hold the port"
		for _, l := range fs.svcLogs {
			if l.kv["portName"] == logsafe.Quote(sp.Name) || (l.kv["portName"] == "" && (l.msg == "Ignoring invalid service" || l.msg == "Skipping service for this IP family")) {
				pr.NotProxied = l.text()
				break
			}
		}
	}

	var cat svcCategorized
	eps := fs.eps[name]
	if pr.Proxied {
		cat = svcCategorize(eps, svcPort, node)
		pr.InternalPolicy, pr.ExternalPolicy = cat.internalPolicy, cat.externalPolicy
		pr.Topology, pr.HasAnyEndpoints = cat.topology, cat.hasAny
		pr.WaysIn = waysIn(svcPort, cat)
	}

	claimed := map[changetracker.Endpoint]bool{}
	for _, c := range cands {
		fam := sliceFamily(c.slice)
		if fam != fs.family && shown[fam] {
			continue // in that family's report
		}
		for k := range c.slice.Endpoints {
			er, excluded := endpointBase(c, k, sp.Name, proto)
			var ep changetracker.Endpoint
			switch {
			case excluded.Reason != "":
			case c.headless:
				excluded = EndpointVerdict{Reason: ReasonSliceHeadless, Detail: "the slice is labelled " + v1.IsHeadlessService + ": proxies do not watch it"}
			case fam == "":
				excluded = EndpointVerdict{Reason: ReasonOtherFamily, Detail: "address type " + string(c.slice.AddressType) + ": proxies use only IPv4 and IPv6 slices"}
			case fam != fs.family:
				excluded = EndpointVerdict{Reason: ReasonOtherFamily, Detail: fmt.Sprintf("an %s slice; the proxy serves the port in %s only", fam, fs.family)}
			default:
				excluded, ep = trackerExclusion(c, k, fs, er, pr, eps, claimed)
			}
			if excluded.Reason != "" {
				er.Internal = excluded
				if pr.ExternalPolicy != "" {
					v := excluded
					er.External = &v
				}
			} else {
				claimed[ep] = true
				er.Internal = cat.verdict(ep, cat.internal, cat.internalPolicy, node)
				if pr.ExternalPolicy != "" {
					v := cat.verdict(ep, cat.external, cat.externalPolicy, node)
					er.External = &v
				}
			}
			pr.Endpoints = append(pr.Endpoints, er)
		}
	}
	return pr
}

// endpointBase fills in what slice endpoint k says about itself, and
// returns a PortName verdict when the slice has no port for the Service
// port.
func endpointBase(c svcCandidate, k int, portName string, proto v1.Protocol) (EndpointReport, EndpointVerdict) {
	e := &c.slice.Endpoints[k]
	er := EndpointReport{Slice: c.slice.Name}
	if len(e.Addresses) > 0 {
		er.Address = e.Addresses[0]
	}
	if e.NodeName != nil {
		er.NodeName = *e.NodeName
	}
	if e.Zone != nil {
		er.Zone = *e.Zone
	}
	cond := e.Conditions
	er.Ready = cond.Ready == nil || *cond.Ready
	er.Serving = cond.Serving == nil || *cond.Serving
	er.Terminating = cond.Terminating != nil && *cond.Terminating
	if h := e.Hints; h != nil {
		for _, z := range h.ForZones {
			er.ZoneHints = append(er.ZoneHints, z.Name)
		}
		for _, n := range h.ForNodes {
			er.NodeHints = append(er.NodeHints, n.Name)
		}
	}
	var have []string
	for _, p := range c.slice.Ports {
		n, pp := "", v1.ProtocolTCP
		if p.Name != nil {
			n = *p.Name
		}
		if p.Protocol != nil && *p.Protocol != "" {
			pp = *p.Protocol
		}
		if n == portName && pp == proto {
			if p.Port != nil {
				er.Port = *p.Port
			}
			return er, EndpointVerdict{}
		}
		num := "no number"
		if p.Port != nil {
			num = strconv.Itoa(int(*p.Port))
		}
		have = append(have, fmt.Sprintf("%q %s/%s", n, num, pp))
	}
	if c.unlabelled || c.headless {
		// Those reasons come first; the port does not matter.
		return er, EndpointVerdict{}
	}
	detail := fmt.Sprintf("the slice has no port named %q with protocol %s", portName, proto)
	if len(have) > 0 {
		detail += "; its ports: " + strings.Join(have, ", ")
	} else {
		detail += "; it has no ports"
	}
	return er, EndpointVerdict{Reason: ReasonPortName, Detail: detail}
}

// trackerExclusion returns why the tracker, not the categorisation, left
// out slice endpoint k, or the zero EndpointVerdict and the tracker's
// endpoint for it when it kept it. claimed holds the tracker's endpoints
// already matched to a slice endpoint: of copies of one endpoint in
// several slices, one is kept, and the others are duplicates.
func trackerExclusion(c svcCandidate, k int, fs *familyState, er EndpointReport, pr PortReport, eps []changetracker.Endpoint, claimed map[changetracker.Endpoint]bool) (EndpointVerdict, changetracker.Endpoint) {
	logs := fs.sliceLogs[c.slice]
	if l, refused := sliceRefusal(logs); refused {
		if c.unlabelled {
			return EndpointVerdict{Reason: ReasonSliceUnlabelled, Detail: l.text()}, nil
		}
		return EndpointVerdict{Reason: ReasonSliceRefused, Detail: l.text()}, nil
	}
	for _, l := range logs {
		if pn, ok := l.kv["portName"]; ok && pn == logsafe.Quote(pr.Name) && !strings.Contains(l.msg, "duplicate") {
			return EndpointVerdict{Reason: ReasonSliceRefused, Detail: l.text()}, nil
		}
	}
	if len(c.slice.Endpoints[k].Addresses) == 0 {
		for _, l := range logs {
			if l.kv["index"] == strconv.Itoa(k) {
				return EndpointVerdict{Reason: ReasonEndpointRefused, Detail: l.text()}, nil
			}
		}
	}
	for _, l := range logs {
		if a, ok := l.kv["address"]; ok && a == logsafe.Quote(er.Address) {
			v := EndpointVerdict{Reason: ReasonEndpointRefused, Detail: l.text()}
			if l.msg == "Ignoring endpoint of the other IP family" {
				v.Reason = ReasonOtherFamily
			}
			return v, nil
		}
	}
	if !pr.Proxied {
		return EndpointVerdict{Reason: ReasonServiceNotProxied, Detail: pr.NotProxied}, nil
	}
	if ep := findEndpoint(eps, er, claimed); ep != nil {
		return EndpointVerdict{}, ep
	}
	ip, _ := changetracker.ParseAddr(er.Address)
	for _, ep := range eps {
		if ep.IP() == ip && ep.Port() == int(er.Port) {
			return EndpointVerdict{Reason: ReasonDuplicate, Detail: "another slice lists " + ep.String() + " too, and the tracker kept that copy"}, nil
		}
	}
	return EndpointVerdict{Reason: ReasonEndpointRefused, Detail: "the tracker did not keep it"}, nil
}

// findEndpoint returns the tracker's endpoint for a slice endpoint, not
// yet claimed by another: the same address (parsed as the tracker parses
// it) and port, with the same conditions and node (of copies of one
// address in several slices, the tracker keeps one).
func findEndpoint(eps []changetracker.Endpoint, er EndpointReport, claimed map[changetracker.Endpoint]bool) changetracker.Endpoint {
	ip, ok := changetracker.ParseAddr(er.Address)
	if !ok {
		return nil
	}
	for _, ep := range eps {
		if !claimed[ep] && ep.IP() == ip && ep.Port() == int(er.Port) && ep.IsReady() == er.Ready &&
			ep.IsServing() == er.Serving && ep.IsTerminating() == er.Terminating && ep.NodeName() == er.NodeName {
			return ep
		}
	}
	return nil
}

// svcCategorized is CategorizeEndpoints' answer for one port, by kind of
// traffic.
type svcCategorized struct {
	internal, external             []changetracker.Endpoint
	internalPolicy, externalPolicy string
	topology                       string
	hasAny                         bool
}

const (
	svcPolicyCluster = "Cluster"
	svcPolicyLocal   = "Local"
)

func svcCategorize(eps []changetracker.Endpoint, svc changetracker.ServicePort, node NodeInfo) svcCategorized {
	cluster, local, _, hasAny := changetracker.CategorizeEndpoints(eps, svc, node.Name, node.Labels)
	c := svcCategorized{hasAny: hasAny, internal: cluster, internalPolicy: svcPolicyCluster}
	if svc.UsesClusterEndpoints() {
		c.topology = changetracker.ClusterTopology(eps, node.Name, node.Labels)
	}
	if svc.InternalPolicyLocal() {
		c.internal, c.internalPolicy = local, svcPolicyLocal
	}
	if svc.ExternallyAccessible() {
		c.external, c.externalPolicy = cluster, svcPolicyCluster
		if svc.ExternalPolicyLocal() {
			c.external, c.externalPolicy = local, svcPolicyLocal
		}
	}
	return c
}

// verdict says whether traffic with policy, given the endpoints list,
// uses ep, and why: the answer is CategorizeEndpoints' (ep in list), the
// reason the endpoint's conditions and hints that led there.
func (c svcCategorized) verdict(ep changetracker.Endpoint, list []changetracker.Endpoint, policy string, node NodeInfo) EndpointVerdict {
	where := "in the cluster"
	if policy == svcPolicyLocal {
		where = "on this node"
	}
	if slices.Contains(list, ep) {
		if !ep.IsReady() {
			return EndpointVerdict{Used: true, Fallback: true, Reason: ReasonTerminatingFallback,
				Detail: "terminating but serving, and used as a fallback: no endpoint is ready " + where}
		}
		return EndpointVerdict{Used: true}
	}
	switch {
	case policy == svcPolicyLocal && !ep.IsLocal():
		on := "on no node"
		if n := ep.NodeName(); n != "" {
			on = "on node " + n
		}
		return EndpointVerdict{Reason: ReasonNotLocal, Detail: on + ", and policy Local uses only the endpoints on this node"}
	case !ep.IsReady() && ep.IsTerminating() && ep.IsServing():
		return EndpointVerdict{Reason: ReasonTerminating, Detail: "terminating but serving; not used as a fallback, because endpoints are ready " + where}
	case !ep.IsReady() && ep.IsTerminating():
		return EndpointVerdict{Reason: ReasonNotServing, Detail: "terminating and not serving"}
	case !ep.IsReady():
		d := "not ready"
		if !ep.IsServing() {
			d += " and not serving"
		}
		return EndpointVerdict{Reason: ReasonNotReady, Detail: d}
	case c.topology == v1.ServiceTrafficDistributionPreferSameNode:
		return EndpointVerdict{Reason: ReasonTopology, Detail: fmt.Sprintf("hinted for node(s) %s; every ready endpoint has node hints, so this node (%s) uses those hinted for it", strings.Join(sets.List(ep.NodeHints()), ","), node.Name)}
	case c.topology == v1.ServiceTrafficDistributionPreferSameZone:
		hints := strings.Join(sets.List(ep.ZoneHints()), ",")
		if hints == "" {
			hints = "no zone"
		}
		return EndpointVerdict{Reason: ReasonTopology, Detail: fmt.Sprintf("hinted for zone(s) %s; every ready endpoint has zone hints, so this node, in zone %s, uses those hinted for its zone", hints, node.Labels[v1.LabelTopologyZone])}
	}
	// CategorizeEndpoints left it out for a reason none of the above
	// names; say so rather than guess.
	return EndpointVerdict{Reason: ReasonUnexplained, Detail: "left out by CategorizeEndpoints for a reason this view cannot name"}
}

// waysIn lists the destinations of the port, with the endpoints the
// tracker gives each.
func waysIn(svc changetracker.ServicePort, c svcCategorized) []WayIn {
	strs := func(eps []changetracker.Endpoint) []string {
		out := make([]string, 0, len(eps))
		for _, ep := range eps {
			out = append(out, ep.String())
		}
		return out
	}
	internal := strs(c.internal)
	ways := []WayIn{{Kind: WayClusterIP, IP: svc.ClusterIP(), Port: svc.Port(), Protocol: svc.Protocol(), Policy: c.internalPolicy, Endpoints: internal}}
	if c.externalPolicy == "" {
		return ways
	}
	external := strs(c.external)
	if svc.NodePort() > 0 {
		ways = append(ways, WayIn{Kind: WayNodePort, Port: svc.NodePort(), Protocol: svc.Protocol(), Policy: c.externalPolicy, Endpoints: external})
	}
	for _, ip := range svc.ExternalIPs() {
		ways = append(ways, WayIn{Kind: WayExternalIP, IP: ip, Port: svc.Port(), Protocol: svc.Protocol(), Policy: c.externalPolicy, Endpoints: external})
	}
	for _, ip := range svc.LoadBalancerVIPs() {
		ways = append(ways, WayIn{Kind: WayLoadBalancer, IP: ip, Port: svc.Port(), Protocol: svc.Protocol(), Policy: c.externalPolicy, Endpoints: external})
	}
	return ways
}

func svcAppendOnce(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}
