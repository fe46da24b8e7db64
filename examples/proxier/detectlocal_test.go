package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDryRunDetectLocal checks that the local-detection flags reach every
// mode's rules, NodeCIDR mode with the Node's spec.podCIDRs.
func TestDryRunDetectLocal(t *testing.T) {
	const cluster = `
apiVersion: v1
kind: Node
metadata: {name: node-a}
spec: {podCIDRs: [10.244.1.0/24]}
status: {addresses: [{type: InternalIP, address: 192.168.0.1}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: ns}
spec:
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ports: [{name: p, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: ns, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.244.1.5]}]
ports: [{name: p, port: 8080, protocol: TCP}]
`
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "cluster.yaml"), []byte(cluster), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mode  string
		flags []string
		want  string
	}{
		{modeIPTables, []string{"--detect-local-mode", "NodeCIDR", "--cluster-cidr", "10.244.0.0/16"}, "--dport 80 ! -s 10.244.1.0/24 -j KUBE-MARK-MASQ"},
		{modeIPTables, []string{"--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", "cni0"}, "--dport 80 ! -i cni0 -j KUBE-MARK-MASQ"},
		{modeIPTables, []string{"--detect-local-mode", "InterfaceNamePrefix", "--pod-interface-name-prefix", "veth"}, "--dport 80 ! -i veth+ -j KUBE-MARK-MASQ"},
		{modeNFTables, []string{"--detect-local-mode", "NodeCIDR"}, "ip saddr != 10.244.1.0/24 jump mark-for-masquerade"},
		{modeNFTables, []string{"--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", "cni0"}, `iifname != "cni0" jump mark-for-masquerade`},
		{modeIPVS, []string{"--detect-local-mode", "InterfaceNamePrefix", "--pod-interface-name-prefix", "veth"}, "dst,dst ! -i veth+ -j KUBE-MARK-MASQ"},
	} {
		t.Run(tc.mode+" "+strings.Join(tc.flags, " "), func(t *testing.T) {
			args := append([]string{"--manifests", dir, "--dry-run", "--hostname-override", "node-a", "--mode", tc.mode}, tc.flags...)
			var out bytes.Buffer
			log, err := runArgs(t, dryRunEnvironment(t, &out), args...)
			if err != nil {
				t.Fatalf("dry run: %v\n%s", err, log)
			}
			if !strings.Contains(out.String(), tc.want) {
				t.Errorf("output lacks %q:\n%s", tc.want, out.String())
			}
		})
	}
}
