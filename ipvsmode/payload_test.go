package ipvsmode_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/proxy"
)

// TestTranslatePayloadHoldsNoAPIText gives IPVS mode Services whose
// namespaces, names and port names are written to end the restore input
// and flush the node's INPUT chain, with every feature that puts rules in
// the payload. IPVS mode's rules match whole ipsets, so no text from the
// API may reach its payload at all: the payload must not hold those names,
// must restore into the strict fake, and must leave only IPVS mode's
// chains and the node's built-in ones. The change tracker refuses such
// names, so the maps are keyed by them by hand, as a caller's own code
// could.
func TestTranslatePayloadHoldsNoAPIText(t *testing.T) {
	inject := "x\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\n-F INPUT\nCOMMIT\n*nat\n#"
	hostile := map[string]changetracker.ServicePortName{
		"a/web":  {NamespacedName: types.NamespacedName{Namespace: inject, Name: "web"}, Port: "p", Protocol: v1.ProtocolTCP},
		"ns/b":   {NamespacedName: types.NamespacedName{Namespace: "ns", Name: `a" -j ACCEPT`}, Port: "\\\"", Protocol: v1.ProtocolTCP},
		"ns/udp": {NamespacedName: types.NamespacedName{Namespace: "ns", Name: "udp"}, Port: "-t\n-F", Protocol: v1.ProtocolUDP},
	}
	ports := []svcPort{
		{name: "a/web", portName: "p", clusterIP: "10.96.0.10", port: 80, nodePort: 30080, externalIPs: []string{"192.0.2.10"},
			lbVIPs: []string{"198.51.100.10"}, sourceRanges: []string{"203.0.113.0/24"}, affinity: 60, endpoints: []endpoint{localPod, remotePod}},
		{name: "ns/b", portName: "q", clusterIP: "10.96.0.11", port: 81, nodePort: 30081, etpLocal: true, hcNodePort: 32000,
			lbVIPs: []string{"198.51.100.11"}, endpoints: []endpoint{localPod}},
		{name: "ns/udp", portName: "dns", proto: v1.ProtocolUDP, clusterIP: "10.96.0.12", port: 53, endpoints: []endpoint{remotePod}},
	}
	svcs, eps := portMaps(t, modeCfg.Family, ports...)
	in := &proxy.FamilyInput{Services: changetracker.ServicePortMap{}, Endpoints: changetracker.EndpointsMap{}, NodeIPs: modeNodeIPs}
	for name, sp := range svcs {
		bad, ok := hostile[name.NamespacedName.String()]
		if !ok {
			t.Fatalf("no hostile name for %s", name)
		}
		in.Services[bad], in.Endpoints[bad] = sp, eps[name]
	}
	translator, err := ipvsmode.NewWriter(modeCfg)
	if err != nil {
		t.Fatal(err)
	}
	tr := translator.Sync(context.Background(), in)
	if len(tr.Services) == 0 {
		t.Fatal("the translation has no virtual servers: the test proves nothing")
	}
	for _, text := range []string{"COMMIT\n*filter\n:INPUT", "-F INPUT", `-j ACCEPT"`, `a\" -j`, "-t\n", inject[:8]} {
		if bytes.Contains(tr.Payload, []byte(text)) {
			t.Errorf("the payload holds API text %q:\n%s", text, tr.Payload)
		}
	}
	n := newNode(modeNodeIPs...)
	n.apply(t, tr)
	f := n.ipt[v1.IPv4Protocol]
	for _, table := range []iptables.Table{iptables.TableFilter, iptables.TableNAT} {
		for _, c := range f.Chains(table) {
			if c.IsBuiltin(table) {
				for _, r := range f.Rules(table, c) {
					if !strings.Contains(r, "-j KUBE-") {
						t.Errorf("%s %s holds %q, which is not a jump to IPVS mode's chains", table, c, r)
					}
				}
				continue
			}
			if !strings.HasPrefix(string(c), "KUBE-") {
				t.Errorf("%s holds chain %s, which is not IPVS mode's", table, c)
			}
		}
	}
}
