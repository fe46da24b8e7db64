package nftables

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/changetracker"
)

// TestChainNames checks that names fit nft's limit with the longest
// prefix, keep kube-proxy's shape, stay unique when cut, and hold no
// character a chain name cannot.
func TestChainNames(t *testing.T) {
	long := strings.Repeat("a", 63)
	name := changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: long, Name: long}, Port: long, Protocol: v1.ProtocolSCTP}
	a := endpointBase(name, netip.MustParseAddr("fd00:1234:5678:9abc:def0:1234:5678:9ab1"), 65535)
	b := endpointBase(name, netip.MustParseAddr("fd00:1234:5678:9abc:def0:1234:5678:9ab2"), 65535)
	if a == b {
		t.Errorf("two endpoints share the name %q", a)
	}
	for _, n := range []string{a, b, portBase(name)} {
		if l := len(affinitySetPrefix + n); l > knftables.NameLengthMax {
			t.Errorf("name of %d bytes: %q", l, n)
		}
		if strings.ContainsAny(n, ": \"{}@;") {
			t.Errorf("name holds a character nft does not take in a chain name: %q", n)
		}
		if !isServiceObject(endpointChainPrefix + n) {
			t.Errorf("%q is not recognised as a per-service name", n)
		}
	}
	short := changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web"}, Port: "http", Protocol: v1.ProtocolTCP}
	if got := portBase(short); !strings.HasSuffix(got, "-ns/web/tcp/http") || len(got) != 8+len("-ns/web/tcp/http") {
		t.Errorf("portBase = %q, want HASH-ns/web/tcp/http", got)
	}
	if got := endpointBase(short, netip.MustParseAddr("fd00::1"), 80); !strings.HasSuffix(got, "-ns/web/tcp/http__fd00..1/80") {
		t.Errorf("endpointBase = %q, want HASH-ns/web/tcp/http__fd00..1/80", got)
	}
	for _, fixed := range []string{servicesChain, rejectChain, filterPreroutingPreDNATChain, markMasqChain} {
		if isServiceObject(fixed) {
			t.Errorf("fixed chain %q taken for a per-service one", fixed)
		}
	}
}

func TestCheckName(t *testing.T) {
	for _, tc := range []struct {
		ns, name, port string
		ok             bool
	}{
		{"ns", "web", "http", true},
		{"ns", "web", "", true},
		{"ns-1", "a-b-c", "p-1", true},
		{"", "web", "p", false},
		{"ns", "-web", "p", false},
		{"ns", "web-", "p", false},
		{"ns", "Web", "p", false},
		{"ns", "web", "p.q", false},
		{"ns", "we b", "p", false},
		{strings.Repeat("a", 64), "web", "p", false},
	} {
		n := changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: tc.ns, Name: tc.name}, Port: tc.port}
		if got := checkName(n) == ""; got != tc.ok {
			t.Errorf("checkName(%q, %q, %q) ok=%v, want %v", tc.ns, tc.name, tc.port, got, tc.ok)
		}
	}
}
