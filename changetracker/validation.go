package changetracker

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The trackers check the API objects they are given the way the API server
// of this module's Kubernetes line (1.37) validates them, because a proxier
// hands the names and numbers on to kernel tools: a namespace holding a
// newline would otherwise end up in iptables-restore input, and one port
// number out of range would make the whole restore fail for every Service.
// Objects normally come from an API server that already refused such input;
// these checks are for manifests, old or non-validating servers, and
// hostile writers. The rules are apimachinery's own helpers, not regexps of
// ours, so they accept exactly what the API server accepts. Names, checked
// for every object at start-up, first go through a byte loop of ours that
// accepts only what apimachinery's DNS-1123 regular expressions accept
// (checked against them by FuzzDNS1123Names); whatever it does not accept
// goes to apimachinery, which decides and words the refusal.

// maxClientIPAffinitySeconds is the API server's upper bound for
// sessionAffinityConfig.clientIP.timeoutSeconds (one day).
const maxClientIPAffinitySeconds = 86400

// errInvalid marks a refusal by validation, as opposed to a Service that is
// simply not proxied in a family (headless, ExternalName, ...).
var errInvalid = errors.New("invalid")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errInvalid}, args...)...)
}

// firstMsg joins apimachinery's messages into one error, nil when there are
// none.
func firstMsg(field, value string, msgs []string) error {
	if len(msgs) == 0 {
		return nil
	}
	return invalidf("%s %q: %s", field, value, strings.Join(msgs, "; "))
}

// validateServiceObject checks what makes the API server refuse a whole
// Service and what the tracker cannot apply to one port alone: the
// namespace and name, every port name, and the ClientIP affinity timeout.
//
// Service names are checked as DNS-1123 labels: KEP-5311
// (RelaxedServiceNameValidation, beta in 1.36 and GA in 1.37) relaxed them
// from DNS-1035 labels, so a 1.37 API server accepts names that start with
// a digit, and the proxy must serve them.
func validateServiceObject(svc *v1.Service) error {
	if err := firstMsg("namespace", svc.Namespace, dns1123Label(svc.Namespace)); err != nil {
		return err
	}
	if err := firstMsg("name", svc.Name, dns1123Label(svc.Name)); err != nil {
		return err
	}
	for i := range svc.Spec.Ports {
		// The API server checks Service port names as DNS-1123 labels
		// (not as IANA service names, which it uses for container ports).
		if n := svc.Spec.Ports[i].Name; n != "" {
			if err := firstMsg("port name", n, dns1123Label(n)); err != nil {
				return err
			}
		}
	}
	switch svc.Spec.SessionAffinity {
	case "", v1.ServiceAffinityNone:
	case v1.ServiceAffinityClientIP:
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			if t := *c.ClientIP.TimeoutSeconds; t <= 0 || t > maxClientIPAffinitySeconds {
				return invalidf("sessionAffinityConfig.clientIP.timeoutSeconds %d: must be in 1..%d", t, maxClientIPAffinitySeconds)
			}
		}
	default:
		return invalidf("sessionAffinity %q: must be None or ClientIP", svc.Spec.SessionAffinity)
	}
	return nil
}

// validateServicePortNumbers checks the numbers of one Service port that
// reach a kernel payload (port, nodePort) and targetPort, as the API server
// does; a bad one drops that port only. A zero nodePort means none; a
// zero or empty targetPort means "the port" (the API server's default).
func validateServicePortNumbers(sp *v1.ServicePort) error {
	if err := firstPortNumMsg("port", int(sp.Port)); err != nil {
		return err
	}
	if sp.NodePort != 0 {
		if err := firstPortNumMsg("nodePort", int(sp.NodePort)); err != nil {
			return err
		}
	}
	switch tp := sp.TargetPort; {
	case tp.Type == intstr.Int && tp.IntVal == 0, tp.Type == intstr.String && tp.StrVal == "":
	case tp.Type == intstr.Int:
		return firstPortNumMsg("targetPort", int(tp.IntVal))
	case tp.Type == intstr.String:
		return firstMsg("targetPort", tp.StrVal, validation.IsValidPortName(tp.StrVal))
	default:
		return invalidf("targetPort of unknown type %d", tp.Type)
	}
	return nil
}

func firstPortNumMsg(field string, n int) error {
	if msgs := validation.IsValidPortNum(n); len(msgs) > 0 {
		return invalidf("%s %d: %s", field, n, strings.Join(msgs, "; "))
	}
	return nil
}

// validProtocol reports whether p is a protocol the API server accepts for
// Service and EndpointSlice ports.
func validProtocol(p v1.Protocol) bool {
	return p == v1.ProtocolTCP || p == v1.ProtocolUDP || p == v1.ProtocolSCTP
}

// validateSliceObject checks what makes the API server refuse a whole
// EndpointSlice and what the tracker needs to attribute it: the namespace
// (a DNS-1123 label), the slice name (a DNS-1123 subdomain), the
// kubernetes.io/service-name label (which must name a Service, so a
// DNS-1123 label), the port names (DNS-1123 labels, as the discovery API
// checks them) and the port protocols.
func validateSliceObject(slice *discoveryv1.EndpointSlice) error {
	if err := firstMsg("namespace", slice.Namespace, dns1123Label(slice.Namespace)); err != nil {
		return err
	}
	if err := firstMsg("name", slice.Name, dns1123Subdomain(slice.Name)); err != nil {
		return err
	}
	svcName, ok := slice.Labels[discoveryv1.LabelServiceName]
	if !ok || svcName == "" {
		return invalidf("no %s label", discoveryv1.LabelServiceName)
	}
	if err := firstMsg(discoveryv1.LabelServiceName+" label", svcName, dns1123Label(svcName)); err != nil {
		return err
	}
	return nil
}

// validateSlicePorts checks the ports of an attributable slice: names and
// protocols as the API server does. A nil protocol is the API's default,
// TCP.
func validateSlicePorts(slice *discoveryv1.EndpointSlice) error {
	for i := range slice.Ports {
		p := &slice.Ports[i]
		if p.Name != nil && *p.Name != "" {
			if err := firstMsg("port name", *p.Name, dns1123Label(*p.Name)); err != nil {
				return err
			}
		}
		if p.Protocol != nil && *p.Protocol != "" && !validProtocol(*p.Protocol) {
			return invalidf("port %d protocol %q: must be TCP, UDP or SCTP", i, *p.Protocol)
		}
	}
	return nil
}

// SpecialAddressReason says why ip cannot be a service address or a
// backend, or returns "" when it can. It refuses what the API server
// refuses as an endpoint or external IP (core validation's
// ValidateEndpointIP): the unspecified address, loopback, link-local
// unicast and link-local multicast. It also refuses every other multicast
// address and the IPv4 broadcast address, which the API server lets
// through (by its own comment probably by mistake): a DNAT target or a
// service address must be unicast, and rules for such an address would
// catch the node's own traffic. The trackers apply it to cluster IPs,
// external IPs, load-balancer ingress IPs and endpoint addresses; the
// rule writers apply it again to what a caller's own ServicePort hands
// them. An IPv4-mapped IPv6 address is judged by its IPv4 address.
func SpecialAddressReason(ip netip.Addr) string {
	ip = ip.Unmap()
	switch {
	case !ip.IsValid():
		return "not an IP address"
	case ip.IsUnspecified():
		return "unspecified address"
	case ip.IsLoopback():
		return "loopback address"
	case ip.IsLinkLocalUnicast():
		return "link-local address"
	case ip.IsMulticast():
		return "multicast address"
	case ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "broadcast address"
	}
	return ""
}

// checkClusterIP says why the cluster IP s, parsed as ip, cannot be
// served, or returns nil. Beyond SpecialAddressReason, which no API server
// hands out from a service range, it refuses an address written as an
// IPv4-mapped IPv6 address (the API server refuses those in new objects
// since 1.36, StrictIPCIDRValidation: the IPv4 and IPv6 tools would read
// it differently) and an address of this node (nodeIPs): its rules would
// take the node's own ports, sshd's included, from every client.
func checkClusterIP(s string, ip netip.Addr, nodeIPs []netip.Addr) error {
	if ip.Is4() && strings.Contains(s, ":") {
		return invalidf("cluster IP %q: an IPv4-mapped IPv6 address", s)
	}
	if reason := SpecialAddressReason(ip); reason != "" {
		return invalidf("cluster IP %q: %s", s, reason)
	}
	if slices.Contains(nodeIPs, ip) {
		return invalidf("cluster IP %q: an address of this node", s)
	}
	return nil
}

// dns1123Label returns apimachinery's IsDNS1123Label messages for s: none
// when isDNS1123Label accepts it, without running the regular expression.
func dns1123Label(s string) []string {
	if isDNS1123Label(s) {
		return nil
	}
	return validation.IsDNS1123Label(s)
}

// dns1123Subdomain returns apimachinery's IsDNS1123Subdomain messages for
// s, as dns1123Label does for labels.
func dns1123Subdomain(s string) []string {
	if isDNS1123Subdomain(s) {
		return nil
	}
	return validation.IsDNS1123Subdomain(s)
}

// isDNS1123Label reports whether s is a DNS-1123 label: at most 63
// characters of [a-z0-9-], starting and ending with [a-z0-9].
func isDNS1123Label(s string) bool {
	return len(s) <= validation.DNS1123LabelMaxLength && isLabelText(s)
}

// isDNS1123Subdomain reports whether s is a DNS-1123 subdomain: at most
// 253 characters of labels as isLabelText reads them (of any length),
// joined by single dots.
func isDNS1123Subdomain(s string) bool {
	if len(s) > validation.DNS1123SubdomainMaxLength {
		return false
	}
	for {
		label, rest, more := strings.Cut(s, ".")
		if !isLabelText(label) {
			return false
		}
		if !more {
			return true
		}
		s = rest
	}
}

// isLabelText reports whether s matches apimachinery's
// [a-z0-9]([-a-z0-9]*[a-z0-9])?, whatever its length.
func isLabelText(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		case c == '-' && i > 0 && i < len(s)-1:
		default:
			return false
		}
	}
	return true
}
