package writertest

import (
	"fmt"
	"net/netip"
	"strings"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// AddressCase is a service port whose addresses a caller's own
// ServicePort hands a rule writer past the tracker: the fields set
// replace the port's own.
type AddressCase struct {
	Name string
	// ClusterIP replaces the port's cluster IP when valid.
	ClusterIP netip.Addr
	// ExternalIPs and VIPs replace the port's lists when not nil.
	ExternalIPs, VIPs []netip.Addr
	// Kept is true when the port must be programmed.
	Kept bool
}

// SpecialAddressCases are the addresses a writer must refuse a port for,
// with a log naming it (the node's own address as cluster IP, and
// addresses no API server hands out), and one it must program: the node's
// address as an external IP, which the API server and kube-proxy allow.
func SpecialAddressCases(nodeIP netip.Addr) []AddressCase {
	a := netip.MustParseAddr
	return []AddressCase{
		{Name: "cluster IP of the node", ClusterIP: nodeIP},
		{Name: "cluster IP loopback", ClusterIP: a("127.0.0.1")},
		{Name: "cluster IP unspecified", ClusterIP: a("0.0.0.0")},
		{Name: "cluster IP broadcast", ClusterIP: a("255.255.255.255")},
		{Name: "cluster IP multicast", ClusterIP: a("224.0.0.251")},
		{Name: "cluster IP link-local", ClusterIP: a("169.254.169.254")},
		{Name: "cluster IP IPv4-mapped", ClusterIP: a("::ffff:10.0.0.1")},
		{Name: "external IP loopback", ExternalIPs: []netip.Addr{a("192.0.2.11"), a("127.0.0.1")}},
		{Name: "load-balancer VIP unspecified", VIPs: []netip.Addr{a("0.0.0.0")}},
		{Name: "external IP of the node", ExternalIPs: []netip.Addr{nodeIP}, Kept: true},
	}
}

// ServiceCIDRStep is one sync of a writer's ServiceCIDR test, on one
// writer with the same two ClusterIP services throughout (ServiceCIDRInside
// and ServiceCIDROutside, each with an endpoint): the ranges the sync
// gets, and whether the outside one must be programmed. The inside one
// always is. After the first sync no service changes, so a port whose
// fate changes shows that the writer judged every port again.
type ServiceCIDRStep struct {
	Name        string
	CIDRs       []netip.Prefix
	OutsideKept bool
}

// The cluster IPs of ServiceCIDRSteps' two services.
const (
	ServiceCIDRInside  = "10.96.0.10"
	ServiceCIDROutside = "10.97.0.1"
)

// ServiceCIDRSteps are the syncs of a writer's ServiceCIDR test, in
// order: ranges unknown, then not holding ServiceCIDROutside, widened to
// hold it, narrowed again, and unknown again (only a range of the other
// family).
func ServiceCIDRSteps() []ServiceCIDRStep {
	p := netip.MustParsePrefix
	return []ServiceCIDRStep{
		{Name: "no ranges", OutsideKept: true},
		{Name: "10.96.0.0/16", CIDRs: []netip.Prefix{p("10.96.0.0/16")}},
		{Name: "widened by 10.97.0.0/16", CIDRs: []netip.Prefix{p("10.96.0.0/16"), p("10.97.0.0/16")}, OutsideKept: true},
		{Name: "narrowed back to 10.96.0.0/16", CIDRs: []netip.Prefix{p("10.96.128.0/20"), p("10.96.0.0/16")}},
		{Name: "only the other family's", CIDRs: []netip.Prefix{p("fd00:96::/108")}, OutsideKept: true},
	}
}

// SkippedPorts returns the servicePort of every "Skipping service port"
// line that logger, a ktesting logger with BufferLogs, holds.
func SkippedPorts(logger klog.Logger) []string {
	var out []string
	for _, e := range logger.GetSink().(ktesting.Underlier).GetBuffer().Data() {
		if !strings.HasPrefix(e.Message, "Skipping service port") {
			continue
		}
		for i := 0; i+1 < len(e.ParameterKVList); i += 2 {
			if e.ParameterKVList[i] == "servicePort" {
				out = append(out, fmt.Sprint(e.ParameterKVList[i+1]))
			}
		}
	}
	return out
}
