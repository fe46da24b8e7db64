package ipvs_test

import (
	"bytes"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/iptables"
)

// TestTranslatePayloadHoldsNoAPIText gives IPVS mode Services whose
// namespaces, names and port names are written to end the restore input
// and flush the node's INPUT chain, with every feature that puts rules in
// the payload. IPVS mode's rules match whole ipsets, so no text from the
// API may reach its payload at all: the payload must not hold those names,
// must restore into the strict fake, and must leave only IPVS mode's
// chains and the node's built-in ones.
func TestTranslatePayloadHoldsNoAPIText(t *testing.T) {
	inject := "x\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\n-F INPUT\nCOMMIT\n*nat\n#"
	ports := []svcPort{
		{name: inject + "/web", portName: "p", clusterIP: "10.96.0.10", port: 80, nodePort: 30080, externalIPs: []string{"192.0.2.10"},
			lbVIPs: []string{"198.51.100.10"}, sourceRanges: []string{"203.0.113.0/24"}, affinity: 60, endpoints: []endpoint{localPod, remotePod}},
		{name: "ns/" + `a" -j ACCEPT`, portName: "\\\"", clusterIP: "10.96.0.11", port: 81, nodePort: 30081, etpLocal: true, hcNodePort: 32000,
			lbVIPs: []string{"198.51.100.11"}, endpoints: []endpoint{localPod}},
		{name: "ns/udp", portName: "-t\n-F", proto: v1.ProtocolUDP, clusterIP: "10.96.0.12", port: 53, endpoints: []endpoint{remotePod}},
	}
	tr := translate(t, modeCfg, ports...)
	for _, text := range []string{"COMMIT\n*filter\n:INPUT", "-F INPUT", `-j ACCEPT"`, `a\" -j`, "-t\n", inject[:8]} {
		if bytes.Contains(tr.Payload, []byte(text)) {
			t.Errorf("the payload holds API text %q:\n%s", text, tr.Payload)
		}
	}
	n := newNode(modeCfg.NodeIPs...)
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
