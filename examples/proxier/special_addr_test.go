package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDryRunRefusesNodeAddressAsClusterIP checks, through --manifests and
// --dry-run in each mode, that a Service whose cluster IP is the node's
// own address gets no rules (they would take the node's port 22 from its
// sshd) and is named in a log line, while the good Service is programmed.
func TestDryRunRefusesNodeAddressAsClusterIP(t *testing.T) {
	const cluster = `apiVersion: v1
kind: Node
metadata: {name: node-a}
status: {addresses: [{type: InternalIP, address: 192.168.0.1}]}
---
apiVersion: v1
kind: Service
metadata: {name: good, namespace: ns}
spec:
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ports: [{name: p, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: good-1, namespace: ns, labels: {kubernetes.io/service-name: good}}
addressType: IPv4
endpoints: [{addresses: [10.244.0.80]}]
ports: [{name: p, port: 8080, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: sshgrab, namespace: ns}
spec:
  clusterIP: 192.168.0.1
  clusterIPs: [192.168.0.1]
  ports: [{name: p, port: 22, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: sshgrab-1, namespace: ns, labels: {kubernetes.io/service-name: sshgrab}}
addressType: IPv4
endpoints: [{addresses: [10.244.0.22]}]
ports: [{name: p, port: 2222, protocol: TCP}]
`
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "cluster.yaml"), []byte(cluster), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mode string
		// good is in the rules of the good Service (its endpoint); bad
		// in those the refused Service would get.
		good string
		bad  []string
	}{
		{modeIPTables, "10.244.0.80:8080", []string{"--dport 22", "10.244.0.22", "sshgrab"}},
		{modeNFTables, "10.244.0.80", []string{". tcp . 22", "10.244.0.22", "sshgrab"}},
		{modeIPVS, "10.244.0.80:8080", []string{"192.168.0.1:22", "10.244.0.22", "sshgrab"}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			var out bytes.Buffer
			log, err := runArgs(t, dryRunEnvironment(t, &out), "--mode", tc.mode, "--manifests", dir, "--dry-run", "--hostname-override", "node-a")
			if err != nil {
				t.Fatalf("dry run: %v\n%s", err, log)
			}
			got := out.String()
			if !strings.Contains(got, tc.good) {
				t.Errorf("the good Service's rules (%q) are missing:\n%s", tc.good, got)
			}
			for _, bad := range tc.bad {
				if strings.Contains(got, bad) {
					t.Errorf("the output holds %q, from the Service that takes the node's address:\n%s", bad, got)
				}
			}
			var refusal string
			for _, line := range strings.Split(log, "\n") {
				if strings.Contains(line, `"Ignoring invalid service"`) && strings.Contains(line, `service="ns/sshgrab"`) {
					refusal = line
				}
			}
			if !strings.Contains(refusal, "an address of this node") {
				t.Errorf("no log line refuses ns/sshgrab for taking the node's address:\n%s", log)
			}
		})
	}
}
