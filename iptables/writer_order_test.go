package iptables_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/proxy"
)

var (
	svcJump = regexp.MustCompile(`^-A (KUBE-SVC-\S+) .* -j (KUBE-SEP-\S+)$`)
	sepDNAT = regexp.MustCompile(`^-A (KUBE-SEP-\S+) .* --to-destination (\S+)$`)
)

// svcEndpointOrder returns, per service chain of payload, the endpoints it
// jumps to, in rule order.
func svcEndpointOrder(payload string) map[string][]string {
	dest := map[string]string{}
	var jumps [][2]string
	for _, line := range strings.Split(payload, "\n") {
		if m := sepDNAT.FindStringSubmatch(line); m != nil {
			dest[m[1]] = m[2]
		}
		if m := svcJump.FindStringSubmatch(line); m != nil {
			jumps = append(jumps, [2]string{m[1], m[2]})
		}
	}
	out := map[string][]string{}
	for _, j := range jumps {
		out[j[0]] = append(out[j[0]], dest[j[1]])
	}
	return out
}

// TestWriterEndpointOrder checks that a service chain lists its endpoints in
// kube-proxy's order, by "ip:port" string, so that a node moved from
// kube-proxy keeps its rules, and that a partial sync after a change keeps
// that order as a full sync would write it.
func TestWriterEndpointOrder(t *testing.T) {
	c := newCluster(v1.IPv4Protocol, "node-a")
	c.setService(makeService("ns", "web", "10.96.0.10"))
	c.setEndpoints("ns", "web", tcp8080, ep{IP: "10.0.0.2"}, ep{IP: "10.0.0.10"}, ep{IP: "10.0.0.1"}, ep{IP: "9.0.0.1"})
	cfg := iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-a"}}
	w := mustWriter(t, cfg)
	f := iptablestest.NewFake()
	res := syncFake(t, w, f, c.input())
	got := svcEndpointOrder(string(res.Payload))
	if len(got) != 1 {
		t.Fatalf("service chains with endpoints: %v, want one", got)
	}
	for _, order := range got {
		if diff := cmp.Diff([]string{"10.0.0.10:8080", "10.0.0.1:8080", "10.0.0.2:8080", "9.0.0.1:8080"}, order); diff != "" {
			t.Errorf("endpoint order (-want +got):\n%s", diff)
		}
	}

	c.setEndpoints("ns", "web", tcp8080, ep{IP: "10.0.0.2"}, ep{IP: "10.0.0.100"}, ep{IP: "10.0.0.1"})
	res = syncFake(t, w, f, c.input())
	if res.Full {
		t.Fatal("the endpoint change synced fully")
	}
	// The partial payload leaves the kept endpoints' chains alone: read
	// the order from the resulting rules.
	got = svcEndpointOrder(f.Dump())
	if len(got) != 1 {
		t.Fatalf("service chains with endpoints after the change: %v, want one", got)
	}
	for _, order := range got {
		if diff := cmp.Diff([]string{"10.0.0.100:8080", "10.0.0.1:8080", "10.0.0.2:8080"}, order); diff != "" {
			t.Errorf("endpoint order after the change (-want +got):\n%s", diff)
		}
	}
	fresh := iptablestest.NewFake()
	syncFake(t, mustWriter(t, cfg), fresh, c.input())
	if diff := cmp.Diff(canonical(fresh.Dump()), canonical(f.Dump())); diff != "" {
		t.Errorf("rules differ from a full sync's (-full +partial):\n%s", diff)
	}
}
