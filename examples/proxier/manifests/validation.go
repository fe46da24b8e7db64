package manifests

import (
	"net/netip"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The embedded cluster refuses, on create and on update, the objects an
// API server of this module's Kubernetes line (1.37) would refuse and that
// would change what a proxier does: a dry run must show what the same
// objects give against a real cluster, where such an object never reaches
// the proxier. The rules here are those the change trackers do not apply
// themselves because they see one object at a time, not a create or an
// update: mostly rules between fields (a healthCheckNodePort on a Service
// that is not a LoadBalancer with externalTrafficPolicy Local, a nodePort
// on a ClusterIP Service, load-balancer status on a Service of another
// type, an EndpointSlice address of the other family, a cluster IP that
// changes). Names are checked too, so that no object the API server would
// not store (a name with a line break, say) is served at all.
//
// A manifest is what a client sends, before the API server fills in its
// defaults (type ClusterIP, protocol TCP, externalTrafficPolicy Cluster, an
// allocated healthCheckNodePort, clusterIPs from clusterIP and the other
// way round), so a field left empty that the server would default is not
// refused.

// validateCreate returns why an API server would refuse to create obj, or
// nil.
func validateCreate(obj runtime.Object) error {
	switch o := obj.(type) {
	case *v1.Service:
		return invalid(o, o.Name, validateService(o))
	case *discoveryv1.EndpointSlice:
		return invalid(o, o.Name, validateEndpointSlice(o))
	case *v1.Node:
		return invalid(o, o.Name, validateNode(o))
	}
	return nil
}

// validateUpdate returns why an API server would refuse to replace old
// with obj, or nil.
func validateUpdate(obj, old runtime.Object) error {
	switch o := obj.(type) {
	case *v1.Service:
		errs := validateService(o)
		if prev, ok := old.(*v1.Service); ok {
			errs = append(errs, validateServiceUpdate(o, prev)...)
		}
		return invalid(o, o.Name, errs)
	case *discoveryv1.EndpointSlice:
		errs := validateEndpointSlice(o)
		if prev, ok := old.(*discoveryv1.EndpointSlice); ok && prev.AddressType != o.AddressType {
			errs = append(errs, field.Invalid(field.NewPath("addressType"), o.AddressType, "field is immutable"))
		}
		return invalid(o, o.Name, errs)
	case *v1.Node:
		return invalid(o, o.Name, validateNode(o))
	}
	return nil
}

// invalid is the API server's 422 Invalid error for errs about obj, nil
// when errs is empty. Its message quotes the name and every value.
func invalid(obj runtime.Object, name string, errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	var gk schema.GroupKind
	switch obj.(type) {
	case *v1.Service:
		gk = schema.GroupKind{Kind: "Service"}
	case *discoveryv1.EndpointSlice:
		gk = schema.GroupKind{Group: discoveryv1.GroupName, Kind: "EndpointSlice"}
	case *v1.Node:
		gk = schema.GroupKind{Kind: "Node"}
	}
	return apierrors.NewInvalid(gk, name, errs)
}

// checkName appends the errors of a DNS-1123 check of value to errs.
func checkName(errs field.ErrorList, path *field.Path, value string, check func(string) []string) field.ErrorList {
	for _, msg := range check(value) {
		errs = append(errs, field.Invalid(path, value, msg))
	}
	return errs
}

// validateMeta checks the namespace (when namespaced), the name and the
// labels, which selectors test.
func validateMeta(namespace, name string, namespaced bool, nameCheck func(string) []string, lbls map[string]string) field.ErrorList {
	var errs field.ErrorList
	meta := field.NewPath("metadata")
	if namespaced {
		errs = checkName(errs, meta.Child("namespace"), namespace, validation.IsDNS1123Label)
	}
	errs = checkName(errs, meta.Child("name"), name, nameCheck)
	return append(errs, metav1validation.ValidateLabels(lbls, meta.Child("labels"))...)
}

// serviceType is svc's type, ClusterIP when it names none.
func serviceType(svc *v1.Service) v1.ServiceType {
	if svc.Spec.Type == "" {
		return v1.ServiceTypeClusterIP
	}
	return svc.Spec.Type
}

// clusterIPs is svc's cluster IPs as the API server stores them: clusterIP
// alone stands for clusterIPs of one.
func clusterIPs(svc *v1.Service) []string {
	if len(svc.Spec.ClusterIPs) == 0 && svc.Spec.ClusterIP != "" {
		return []string{svc.Spec.ClusterIP}
	}
	return svc.Spec.ClusterIPs
}

// externallyAccessible is the API's notion: reachable from outside the
// cluster through node ports, a load balancer or external IPs.
func externallyAccessible(svc *v1.Service) bool {
	switch serviceType(svc) {
	case v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer:
		return true
	case v1.ServiceTypeClusterIP:
		return len(svc.Spec.ExternalIPs) > 0
	}
	return false
}

// needsHealthCheck tells whether svc gets a healthCheckNodePort.
func needsHealthCheck(svc *v1.Service) bool {
	return serviceType(svc) == v1.ServiceTypeLoadBalancer && svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
}

func validateService(svc *v1.Service) field.ErrorList {
	// Service names are DNS-1123 labels since RelaxedServiceNameValidation
	// (GA in 1.37), as the trackers check them.
	errs := validateMeta(svc.Namespace, svc.Name, true, validation.IsDNS1123Label, svc.Labels)
	spec := field.NewPath("spec")
	typ := serviceType(svc)
	ips := clusterIPs(svc)
	headless := len(ips) > 0 && ips[0] == v1.ClusterIPNone

	switch typ {
	case v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer:
	case v1.ServiceTypeExternalName:
		if len(ips) > 0 {
			errs = append(errs, field.Forbidden(spec.Child("clusterIPs"), "may not be set for ExternalName services"))
		}
		if len(svc.Spec.IPFamilies) > 0 {
			errs = append(errs, field.Forbidden(spec.Child("ipFamilies"), "may not be set for ExternalName services"))
		}
		if svc.Spec.IPFamilyPolicy != nil {
			errs = append(errs, field.Forbidden(spec.Child("ipFamilyPolicy"), "may not be set for ExternalName services"))
		}
	default:
		errs = append(errs, field.NotSupported(spec.Child("type"), svc.Spec.Type,
			[]v1.ServiceType{v1.ServiceTypeClusterIP, v1.ServiceTypeExternalName, v1.ServiceTypeLoadBalancer, v1.ServiceTypeNodePort}))
	}
	if headless && (typ == v1.ServiceTypeNodePort || typ == v1.ServiceTypeLoadBalancer) {
		errs = append(errs, field.Invalid(spec.Child("clusterIPs").Index(0), v1.ClusterIPNone, "may not be set to 'None' for "+string(typ)+" services"))
	}

	errs = append(errs, validateServicePorts(svc, typ, headless, spec.Child("ports"))...)
	if typ != v1.ServiceTypeExternalName {
		errs = append(errs, validateClusterIPs(svc, ips, spec)...)
	}

	if svc.Spec.SessionAffinityConfig != nil && (svc.Spec.SessionAffinity == "" || svc.Spec.SessionAffinity == v1.ServiceAffinityNone) {
		errs = append(errs, field.Forbidden(spec.Child("sessionAffinityConfig"), "must not be set when session affinity is None"))
	}
	if len(svc.Spec.LoadBalancerSourceRanges) > 0 && typ != v1.ServiceTypeLoadBalancer {
		errs = append(errs, field.Forbidden(spec.Child("loadBalancerSourceRanges"), "may only be used when `type` is 'LoadBalancer'"))
	}

	etp := spec.Child("externalTrafficPolicy")
	switch p := svc.Spec.ExternalTrafficPolicy; {
	case p == "":
		// Defaulted to Cluster where it applies.
	case !externallyAccessible(svc):
		errs = append(errs, field.Invalid(etp, p, "may only be set for externally-accessible services"))
	case p != v1.ServiceExternalTrafficPolicyCluster && p != v1.ServiceExternalTrafficPolicyLocal:
		errs = append(errs, field.NotSupported(etp, p, []v1.ServiceExternalTrafficPolicy{v1.ServiceExternalTrafficPolicyCluster, v1.ServiceExternalTrafficPolicyLocal}))
	}
	if hc := svc.Spec.HealthCheckNodePort; hc != 0 {
		// A zero one is allocated by the API server where it is needed.
		if !needsHealthCheck(svc) {
			errs = append(errs, field.Invalid(spec.Child("healthCheckNodePort"), hc, "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'"))
		} else {
			for _, msg := range validation.IsValidPortNum(int(hc)) {
				errs = append(errs, field.Invalid(spec.Child("healthCheckNodePort"), hc, msg))
			}
		}
	}
	if p := svc.Spec.InternalTrafficPolicy; p != nil && *p != v1.ServiceInternalTrafficPolicyCluster && *p != v1.ServiceInternalTrafficPolicyLocal {
		errs = append(errs, field.NotSupported(spec.Child("internalTrafficPolicy"), *p, []v1.ServiceInternalTrafficPolicy{v1.ServiceInternalTrafficPolicyCluster, v1.ServiceInternalTrafficPolicyLocal}))
	}
	if d := svc.Spec.TrafficDistribution; d != nil {
		switch *d {
		case v1.ServiceTrafficDistributionPreferClose, v1.ServiceTrafficDistributionPreferSameZone, v1.ServiceTrafficDistributionPreferSameNode:
		default:
			errs = append(errs, field.NotSupported(spec.Child("trafficDistribution"), *d, []string{v1.ServiceTrafficDistributionPreferClose, v1.ServiceTrafficDistributionPreferSameNode, v1.ServiceTrafficDistributionPreferSameZone}))
		}
	}
	return append(errs, validateLoadBalancerStatus(svc, typ)...)
}

// validateServicePorts checks what the API server checks across a
// Service's ports: names present when there are several, and unique; no
// two ports, nor two node ports, with the same number and protocol; no
// node port on a ClusterIP Service.
func validateServicePorts(svc *v1.Service, typ v1.ServiceType, headless bool, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(svc.Spec.Ports) == 0 && !headless && typ != v1.ServiceTypeExternalName {
		errs = append(errs, field.Required(path, ""))
	}
	type key struct {
		protocol v1.Protocol
		port     int32
	}
	portNames := map[string]bool{}
	ports, nodePorts := map[key]bool{}, map[key]bool{}
	for i := range svc.Spec.Ports {
		sp := &svc.Spec.Ports[i]
		p := path.Index(i)
		switch {
		case sp.Name == "" && len(svc.Spec.Ports) > 1:
			errs = append(errs, field.Required(p.Child("name"), ""))
		case sp.Name != "" && portNames[sp.Name]:
			errs = append(errs, field.Duplicate(p.Child("name"), sp.Name))
		}
		portNames[sp.Name] = true
		proto := sp.Protocol
		if proto == "" {
			proto = v1.ProtocolTCP
		}
		if k := (key{proto, sp.Port}); ports[k] {
			errs = append(errs, field.Duplicate(p, string(k.protocol)+"/"+strconv.Itoa(int(sp.Port))))
		} else {
			ports[k] = true
		}
		if sp.NodePort == 0 {
			continue
		}
		if typ == v1.ServiceTypeClusterIP {
			errs = append(errs, field.Forbidden(p.Child("nodePort"), "may not be used when `type` is 'ClusterIP'"))
		}
		if k := (key{proto, sp.NodePort}); nodePorts[k] {
			errs = append(errs, field.Duplicate(p.Child("nodePort"), sp.NodePort))
		} else {
			nodePorts[k] = true
		}
	}
	return errs
}

// validateClusterIPs checks clusterIP, clusterIPs, ipFamilies and
// ipFamilyPolicy against each other, as the API server does (and its IP
// allocator, for a single-stack policy with two addresses). ips is
// clusterIPs as stored.
func validateClusterIPs(svc *v1.Service, ips []string, spec *field.Path) field.ErrorList {
	var errs field.ErrorList
	ipsPath := spec.Child("clusterIPs")
	if c := svc.Spec.ClusterIP; c != "" && len(svc.Spec.ClusterIPs) > 0 && svc.Spec.ClusterIPs[0] != c {
		errs = append(errs, field.Invalid(ipsPath, svc.Spec.ClusterIPs, "first value must match `clusterIP`"))
	}
	if len(ips) > 2 {
		errs = append(errs, field.Invalid(ipsPath, ips, "may only hold up to 2 values"))
	}
	seen := map[v1.IPFamily]bool{}
	for i, f := range svc.Spec.IPFamilies {
		switch {
		case f != v1.IPv4Protocol && f != v1.IPv6Protocol:
			errs = append(errs, field.NotSupported(spec.Child("ipFamilies").Index(i), f, []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}))
		case seen[f]:
			errs = append(errs, field.Duplicate(spec.Child("ipFamilies").Index(i), f))
		}
		seen[f] = true
	}
	policy := svc.Spec.IPFamilyPolicy
	if policy != nil {
		switch *policy {
		case v1.IPFamilyPolicySingleStack, v1.IPFamilyPolicyPreferDualStack, v1.IPFamilyPolicyRequireDualStack:
		default:
			errs = append(errs, field.NotSupported(spec.Child("ipFamilyPolicy"), *policy,
				[]v1.IPFamilyPolicy{v1.IPFamilyPolicyPreferDualStack, v1.IPFamilyPolicyRequireDualStack, v1.IPFamilyPolicySingleStack}))
		}
	}
	if len(ips) > 0 && ips[0] == v1.ClusterIPNone {
		if len(ips) > 1 {
			errs = append(errs, field.Invalid(ipsPath, ips, "'None' must be the first and only value"))
		}
		return errs
	}
	families := make([]v1.IPFamily, 0, len(ips))
	for i, s := range ips {
		ip, err := netip.ParseAddr(s)
		if err != nil || ip.Zone() != "" || ip.Is4In6() {
			errs = append(errs, field.Invalid(ipsPath.Index(i), s, "must be a valid IP address"))
			return errs
		}
		f := v1.IPv4Protocol
		if ip.Is6() {
			f = v1.IPv6Protocol
		}
		families = append(families, f)
		if i < len(svc.Spec.IPFamilies) && svc.Spec.IPFamilies[i] != f {
			errs = append(errs, field.Invalid(ipsPath.Index(i), s, "expected an "+string(svc.Spec.IPFamilies[i])+" value as indicated by `ipFamilies["+strconv.Itoa(i)+"]`"))
		}
	}
	if len(families) == 2 && families[0] == families[1] {
		errs = append(errs, field.Invalid(ipsPath, ips, "may specify no more than one IP for each IP family"))
	}
	if policy != nil && *policy == v1.IPFamilyPolicySingleStack && (len(ips) > 1 || len(svc.Spec.IPFamilies) > 1) {
		errs = append(errs, field.Invalid(spec.Child("ipFamilyPolicy"), *policy, "must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified"))
	}
	return errs
}

// validateLoadBalancerStatus checks the load-balancer status a manifest
// (like an object saved from a cluster) carries as if written through the
// status subresource: only a LoadBalancer Service may have one (since
// Kubernetes 1.29; a proxier would otherwise serve its VIPs), and an
// ingress's ipMode needs its ip and must be VIP or Proxy.
func validateLoadBalancerStatus(svc *v1.Service, typ v1.ServiceType) field.ErrorList {
	var errs field.ErrorList
	ingress := field.NewPath("status", "loadBalancer", "ingress")
	if len(svc.Status.LoadBalancer.Ingress) > 0 && typ != v1.ServiceTypeLoadBalancer {
		errs = append(errs, field.Forbidden(ingress, "may only be used when `spec.type` is 'LoadBalancer'"))
	}
	for i, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IPMode == nil {
			continue
		}
		p := ingress.Index(i).Child("ipMode")
		if ing.IP == "" {
			errs = append(errs, field.Required(p, "must be specified only when `ip` is set"))
		}
		if m := *ing.IPMode; m != v1.LoadBalancerIPModeVIP && m != v1.LoadBalancerIPModeProxy {
			errs = append(errs, field.NotSupported(p, m, []v1.LoadBalancerIPMode{v1.LoadBalancerIPModeProxy, v1.LoadBalancerIPModeVIP}))
		}
	}
	return errs
}

// validateServiceUpdate checks what may not change: the primary cluster IP
// (unless the Service becomes or stops being ExternalName, or stays
// headless) and the healthCheckNodePort of a Service that keeps needing
// one. A healthCheckNodePort or cluster IP left out of the new manifest is
// not refused: the API server would keep the one it allocated.
func validateServiceUpdate(svc, old *v1.Service) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	if serviceType(svc) != v1.ServiceTypeExternalName && serviceType(old) != v1.ServiceTypeExternalName {
		newIPs, oldIPs := clusterIPs(svc), clusterIPs(old)
		if len(newIPs) > 0 && len(oldIPs) > 0 && newIPs[0] != oldIPs[0] {
			errs = append(errs, field.Invalid(spec.Child("clusterIPs").Index(0), newIPs, "may not change once set"))
		}
	}
	if needsHealthCheck(svc) && needsHealthCheck(old) {
		if n, o := svc.Spec.HealthCheckNodePort, old.Spec.HealthCheckNodePort; n != 0 && o != 0 && n != o {
			errs = append(errs, field.Forbidden(spec.Child("healthCheckNodePort"), "field is immutable"))
		}
	}
	return errs
}

// Limits of the discovery API for one EndpointSlice.
const (
	maxSliceEndpoints = 1000
	maxSliceAddresses = 100
	maxSlicePorts     = 100
	maxHints          = 8
)

// validateEndpointSlice checks what the discovery API checks and the
// tracker does not: the address type, that every address is of it, the
// size limits, unique port names (whatever their protocol), node names
// and hints.
func validateEndpointSlice(slice *discoveryv1.EndpointSlice) field.ErrorList {
	errs := validateMeta(slice.Namespace, slice.Name, true, validation.IsDNS1123Subdomain, slice.Labels)
	typ := field.NewPath("addressType")
	switch slice.AddressType {
	case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN:
	case "":
		errs = append(errs, field.Required(typ, ""))
	default:
		errs = append(errs, field.NotSupported(typ, slice.AddressType,
			[]discoveryv1.AddressType{discoveryv1.AddressTypeFQDN, discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6}))
	}
	endpoints := field.NewPath("endpoints")
	if len(slice.Endpoints) > maxSliceEndpoints {
		return append(errs, field.TooMany(endpoints, len(slice.Endpoints), maxSliceEndpoints))
	}
	for i := range slice.Endpoints {
		ep := &slice.Endpoints[i]
		p := endpoints.Index(i)
		addrs := p.Child("addresses")
		switch n := len(ep.Addresses); {
		case n == 0:
			errs = append(errs, field.Required(addrs, "must contain at least 1 address"))
		case n > maxSliceAddresses:
			errs = append(errs, field.TooMany(addrs, n, maxSliceAddresses))
		}
		for j, a := range ep.Addresses {
			if msg := addressOfType(a, slice.AddressType); msg != "" {
				errs = append(errs, field.Invalid(addrs.Index(j), a, msg))
			}
		}
		if ep.NodeName != nil {
			errs = checkName(errs, p.Child("nodeName"), *ep.NodeName, validation.IsDNS1123Subdomain)
		}
		if h := ep.Hints; h != nil {
			if len(h.ForZones) > maxHints {
				errs = append(errs, field.TooMany(p.Child("hints", "forZones"), len(h.ForZones), maxHints))
			}
			if len(h.ForNodes) > maxHints {
				errs = append(errs, field.TooMany(p.Child("hints", "forNodes"), len(h.ForNodes), maxHints))
			}
			for j, n := range h.ForNodes {
				errs = checkName(errs, p.Child("hints", "forNodes").Index(j).Child("name"), n.Name, validation.IsDNS1123Subdomain)
			}
		}
	}
	ports := field.NewPath("ports")
	if len(slice.Ports) > maxSlicePorts {
		return append(errs, field.TooMany(ports, len(slice.Ports), maxSlicePorts))
	}
	portNames := map[string]bool{}
	for i, sp := range slice.Ports {
		name := ""
		if sp.Name != nil {
			name = *sp.Name
		}
		if portNames[name] {
			errs = append(errs, field.Duplicate(ports.Index(i).Child("name"), name))
		}
		portNames[name] = true
	}
	return errs
}

// addressOfType returns why address is not one of an EndpointSlice of
// addressType, or "". Special addresses (loopback and the like) are left
// to the tracker, which skips those endpoints.
func addressOfType(address string, addressType discoveryv1.AddressType) string {
	switch addressType {
	case discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6:
		ip, err := netip.ParseAddr(address)
		switch {
		case err != nil || ip.Zone() != "":
			return "must be a valid IP address"
		case addressType == discoveryv1.AddressTypeIPv4 && !ip.Is4():
			return "must be a valid IPv4 address"
		case addressType == discoveryv1.AddressTypeIPv6 && (!ip.Is6() || ip.Is4In6()):
			return "must be a valid IPv6 address"
		}
	case discoveryv1.AddressTypeFQDN:
		if msgs := validation.IsDNS1123Subdomain(strings.TrimSuffix(address, ".")); len(msgs) > 0 {
			return strings.Join(msgs, "; ")
		}
	}
	return ""
}

// validateNode checks the Node's name and labels (the node informer
// selects it by name; topology comes from its labels) and its pod CIDRs,
// from which a proxier may tell local traffic.
func validateNode(node *v1.Node) field.ErrorList {
	errs := validateMeta("", node.Name, false, validation.IsDNS1123Subdomain, node.Labels)
	cidrs := field.NewPath("spec", "podCIDRs")
	if len(node.Spec.PodCIDRs) > 2 {
		errs = append(errs, field.TooMany(cidrs, len(node.Spec.PodCIDRs), 2))
	}
	var families []bool
	for i, s := range node.Spec.PodCIDRs {
		pfx, err := netip.ParsePrefix(s)
		if err != nil || pfx.Addr().Zone() != "" {
			errs = append(errs, field.Invalid(cidrs.Index(i), s, "must be a valid CIDR value"))
			continue
		}
		families = append(families, pfx.Addr().Is4())
	}
	if len(families) == 2 && families[0] == families[1] {
		errs = append(errs, field.Invalid(cidrs, node.Spec.PodCIDRs, "may specify no more than one CIDR for each IP family"))
	}
	return errs
}
