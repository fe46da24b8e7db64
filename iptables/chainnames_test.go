package iptables_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/iptables"
)

// kubeChains are kube-proxy's chain names, which most tests expect.
var kubeChains = iptables.DefaultChainNames()

func portName(ns, name, port string, proto v1.Protocol) changetracker.ServicePortName {
	return changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}, Port: port, Protocol: proto}
}

// The expected names are the ones kube-proxy gives the same service ports
// and endpoints (from its iptables proxier tests), so that users moving
// from kube-proxy see the chains they know.
func TestChainNamesMatchKubeProxy(t *testing.T) {
	svc1 := portName("ns1", "svc1", "p80", v1.ProtocolTCP)
	got := []iptables.Chain{
		kubeChains.ServiceCluster(svc1),
		kubeChains.ServiceLocal(svc1),
		kubeChains.ServiceExternal(svc1),
		kubeChains.ServiceFirewall(svc1),
		kubeChains.Endpoint(svc1, "10.180.0.1:80"),
		kubeChains.Endpoint(svc1, "10.180.2.1:80"),
	}
	want := []iptables.Chain{
		"KUBE-SVC-XPGD46QRK7WJZT7O",
		"KUBE-SVL-XPGD46QRK7WJZT7O",
		"KUBE-EXT-XPGD46QRK7WJZT7O",
		"KUBE-FW-XPGD46QRK7WJZT7O",
		"KUBE-SEP-SXIVWICOYRO3J4NJ",
		"KUBE-SEP-ZX7GRIZKSNUQ3LAJ",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("chain names (-want +got):\n%s", diff)
	}
}

func TestChainNamesDistinguishPorts(t *testing.T) {
	names := []changetracker.ServicePortName{
		portName("ns", "svc", "", v1.ProtocolTCP),
		portName("ns", "svc", "", v1.ProtocolUDP),
		portName("ns", "svc", "", v1.ProtocolSCTP),
		portName("ns", "svc", "a", v1.ProtocolTCP),
		portName("ns", "svc2", "", v1.ProtocolTCP),
		portName("ns2", "svc", "", v1.ProtocolTCP),
		// A very long name still gives a valid chain name.
		portName(strings.Repeat("n", 63), strings.Repeat("s", 63), strings.Repeat("p", 15), v1.ProtocolTCP),
	}
	seen := map[iptables.Chain]string{}
	check := func(c iptables.Chain, what string) {
		t.Helper()
		if len(c) > iptables.MaxChainNameLength {
			t.Errorf("%s: chain %s is longer than %d bytes", what, c, iptables.MaxChainNameLength)
		}
		if !kubeChains.IsServiceChain(c) {
			t.Errorf("%s: IsServiceChain(%s) = false", what, c)
		}
		if other, dup := seen[c]; dup {
			t.Errorf("%s and %s share chain %s", what, other, c)
		}
		seen[c] = what
	}
	for _, n := range names {
		what := n.String() + "/" + string(n.Protocol)
		check(kubeChains.ServiceCluster(n), what+" SVC")
		check(kubeChains.ServiceLocal(n), what+" SVL")
		check(kubeChains.ServiceExternal(n), what+" EXT")
		check(kubeChains.ServiceFirewall(n), what+" FW")
		check(kubeChains.Endpoint(n, "10.0.0.1:80"), what+" SEP 10.0.0.1:80")
		check(kubeChains.Endpoint(n, "10.0.0.1:81"), what+" SEP 10.0.0.1:81")
		check(kubeChains.Endpoint(n, "[fd00::1]:80"), what+" SEP [fd00::1]:80")
	}
}

func TestIsServiceChain(t *testing.T) {
	for _, tc := range []struct {
		chain iptables.Chain
		want  bool
	}{
		{"KUBE-SVC-XPGD46QRK7WJZT7O", true},
		{"KUBE-SVL-XPGD46QRK7WJZT7O", true},
		{"KUBE-EXT-XPGD46QRK7WJZT7O", true},
		{"KUBE-FW-XPGD46QRK7WJZT7O", true},
		{"KUBE-SEP-SXIVWICOYRO3J4NJ", true},
		{"KUBE-SERVICES", false},
		{"KUBE-NODEPORTS", false},
		{"KUBE-SVC-SHORT", false},
		{"KUBE-SVC-XPGD46QRK7WJZT7OX", false},
		{"KUBE-XLB-XPGD46QRK7WJZT7O", false},
		{"", false},
	} {
		if got := kubeChains.IsServiceChain(tc.chain); got != tc.want {
			t.Errorf("IsServiceChain(%q) = %v, want %v", tc.chain, got, tc.want)
		}
	}
}
