package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const serviceCIDRCluster = `apiVersion: v1
kind: Node
metadata: {name: node-a}
status:
  addresses:
  - {type: InternalIP, address: 192.168.10.11}
  - {type: InternalIP, address: "fd00:10::11"}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ports: [{name: http, port: 80, protocol: TCP}]
`

const serviceCIDRObjects = `---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: kubernetes}
spec: {cidrs: [10.96.0.0/16, "fd00:96::/112"]}
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: wider}
spec: {cidrs: [10.96.0.0/12]}
---
apiVersion: networking.k8s.io/v1
kind: ServiceCIDR
metadata: {name: bogus}
spec: {cidrs: [10.50.0.0/16, 10.51.0.0/16]}
`

// TestDryRunServiceCIDRs checks that ServiceCIDRs given with --manifests
// reach nftables mode's rules, each family its own, nested ranges merged
// and an object the API server would refuse logged by name and left out;
// and that iptables and IPVS modes print the same with and without them.
func TestDryRunServiceCIDRs(t *testing.T) {
	dryRun := func(mode string, withCIDRs bool) (string, string) {
		t.Helper()
		dir := t.TempDir()
		manifest := serviceCIDRCluster
		if withCIDRs {
			manifest += serviceCIDRObjects
		}
		if err := os.WriteFile(filepath.Join(dir, "cluster.yaml"), []byte(manifest), 0o644); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		log, err := runArgs(t, dryRunEnvironment(t, &out), "--mode", mode, "--dry-run", "--manifests", dir, "--hostname-override", "node-a")
		if err != nil {
			t.Fatalf("%s dry run: %v\n%s", mode, err, log)
		}
		return out.String(), log
	}

	out, log := dryRun("nftables", true)
	for _, want := range []string{
		"add rule ip kube-proxy cluster-ips-check ip daddr { 10.96.0.0/12 } drop\n",
		"add rule ip6 kube-proxy cluster-ips-check ip6 daddr { fd00:96::/112 } drop\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("nftables dry run lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "10.50.0.0") {
		t.Errorf("nftables dry run has the refused ServiceCIDR's range:\n%s", out)
	}
	if !strings.Contains(log, "Ignoring a ServiceCIDR the API server would refuse") || !strings.Contains(log, `serviceCIDR="bogus"`) {
		t.Errorf("no log names the refused ServiceCIDR:\n%s", log)
	}
	if out, _ := dryRun("nftables", false); strings.Contains(out, "} drop\n") {
		t.Errorf("nftables dry run without ServiceCIDRs drops a range:\n%s", out)
	}
	for _, mode := range []string{"iptables", "ipvs"} {
		with, _ := dryRun(mode, true)
		without, _ := dryRun(mode, false)
		if with != without {
			t.Errorf("%s mode's dry run changes with ServiceCIDRs", mode)
		}
	}
}
