package changetracker

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/klog/v2/textlogger"
	"k8s.io/utils/ptr"
)

// klogHeader is how every line klog's text format writes starts.
var klogHeader = regexp.MustCompile(`^[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d{6} +\d+ [^ :]+:\d+\] `)

// forged is what a hostile name tries to make the log show.
const forged = "\nE1127 00:00:00.000000       1 forged.go:1] \"forged\"\r"

// TestLogLinesCannotBeForged feeds the trackers Services and
// EndpointSlices whose names, port names, protocols, addresses and
// annotations carry line breaks and carriage returns, at every verbosity,
// and checks that every line of the log is a line klog wrote: none starts
// without klog's header, and none holds a carriage return.
func TestLogLinesCannotBeForged(t *testing.T) {
	var buf bytes.Buffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf), textlogger.Verbosity(10)))
	svcs := []*v1.Service{
		makeService("ns", "bad"+forged),
		makeService("ns"+forged, "bad"),
		makeService("ns", "bad", withPorts(v1.ServicePort{Name: "http" + forged, Port: 80, Protocol: v1.ProtocolTCP})),
		makeService("ns", "bad", withPorts(v1.ServicePort{Name: "http", Port: 80, Protocol: v1.Protocol("TCP" + forged)})),
		makeService("ns", "bad", withPorts(v1.ServicePort{Name: "http", Port: 80}, v1.ServicePort{Name: "http", Port: 81})),
		makeService("ns", "bad", withClusterIPs("10.0.0.1"+forged)),
		makeService("ns", "bad", func(s *v1.Service) {
			s.Spec.ExternalIPs = []string{"192.0.2.1" + forged, "127.0.0.1"}
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.2" + forged}, {IP: "0.0.0.0"}}
			s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/8" + forged}
		}),
		makeService("ns", "bad", func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinity("ClientIP" + forged) }),
	}
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		tr := NewServiceChangeTracker(family, nil, WithLogger(logger))
		for _, s := range svcs {
			tr.Update(nil, s)
		}
		ServicePortMap{}.Update(tr)
		if _, err := NewBaseServicePort(logger, svcs[0], &svcs[0].Spec.Ports[0], family); err != nil {
			logger.Error(err, "NewBaseServicePort")
		}
	}

	const v4 = discoveryv1.AddressTypeIPv4
	http := []port{namedPort("http", 8080, v1.ProtocolTCP)}
	withLabel := makeSlice("ns", "a", "a-1", v4, http, readyEP("10.0.0.1", "n"))
	withLabel.Labels[discoveryv1.LabelServiceName] = "a" + forged
	annotated := makeSlice("ns", "a", "a-2", v4, http, readyEP("10.0.0.1", "n"))
	annotated.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: "yesterday" + forged}
	slices := []*discoveryv1.EndpointSlice{
		makeSlice("ns", "a", "a-1"+forged, v4, http, readyEP("10.0.0.1", "n")),
		makeSlice("ns"+forged, "a", "a-1", v4, http, readyEP("10.0.0.1", "n")),
		withLabel,
		annotated,
		makeSlice("ns", "a", "a-3", v4, []port{namedPort("http"+forged, 80, v1.ProtocolTCP)}, readyEP("10.0.0.1", "n")),
		makeSlice("ns", "a", "a-4", v4, []port{namedPort("http", 80, v1.Protocol("TCP"+forged))}, readyEP("10.0.0.1", "n")),
		makeSlice("ns", "a", "a-5", v4, []port{{name: ptr.To("nil-port")}, namedPort("http", 80, v1.ProtocolTCP), namedPort("http", 81, v1.ProtocolTCP)},
			readyEP("10.0.0.1"+forged, "n"), readyEP("fd00::1"+forged, "n"), readyEP("127.0.0.1", "n"), readyEP("fd00::1", "n")),
	}
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		tr := NewEndpointsChangeTracker(family, "n", nil, WithLogger(logger))
		for _, s := range slices {
			tr.EndpointSliceUpdate(s, false)
		}
		EndpointsMap{}.Update(tr)
	}

	out := buf.String()
	if len(out) == 0 {
		t.Fatal("nothing was logged")
	}
	lines := regexp.MustCompile(`\r\n|\n|\r`).Split(out, -1)
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	logged := 0
	for i, l := range lines {
		if !klogHeader.MatchString(l) || strings.HasPrefix(l, forged[1:30]) {
			t.Errorf("line %d is not a klog line (forged or split): %q", i+1, l)
			continue
		}
		logged++
	}
	if bytes.Contains(buf.Bytes(), []byte("\r")) {
		t.Errorf("the log holds a carriage return")
	}
	// One line per refusal at least: a test that logs nothing would pass.
	if logged < len(svcs)+len(slices) {
		t.Errorf("%d log lines, want at least %d (one per refused object):\n%s", logged, len(svcs)+len(slices), out)
	}
}
