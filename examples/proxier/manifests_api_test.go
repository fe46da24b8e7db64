package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/proxykit/proxykit/iptables"
)

// nodeA is the Node the dry runs of this file run on, as a manifest
// document and its separator.
const nodeA = `apiVersion: v1
kind: Node
metadata: {name: node-a}
status: {addresses: [{type: InternalIP, address: 192.168.0.1}]}
---
`

// dryRunManifest runs the proxier dry on node-a, with cluster as its one
// manifest file, and returns its output and its log.
func dryRunManifest(t *testing.T, cluster string) (out, log string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "cluster.yaml"), []byte(cluster), 0o644); err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	log, err := runArgs(t, dryRunEnvironment(t, &stdout), "--manifests", dir, "--dry-run", "--hostname-override", "node-a")
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, log)
	}
	return stdout.String(), log
}

// TestDryRunManifestSelectors checks that --manifests gives the proxier
// what an API server would with kube-proxy's selectors: a Service labelled
// for another proxy, a headless Service and an EndpointSlice labelled
// headless are not programmed; the rest is.
func TestDryRunManifestSelectors(t *testing.T) {
	const cluster = nodeA + `apiVersion: v1
kind: Service
metadata: {name: plain, namespace: ns}
spec: {clusterIP: 10.96.0.10, ports: [{name: p, port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: plain-1, namespace: ns, labels: {kubernetes.io/service-name: plain}}
addressType: IPv4
endpoints: [{addresses: [10.244.0.5]}]
ports: [{name: p, port: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: plain-2, namespace: ns, labels: {kubernetes.io/service-name: plain, service.kubernetes.io/headless: ""}}
addressType: IPv4
endpoints: [{addresses: [10.244.0.77]}]
ports: [{name: p, port: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: other, namespace: ns, labels: {service.kubernetes.io/service-proxy-name: other}}
spec: {clusterIP: 10.96.0.11, ports: [{name: p, port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: other-1, namespace: ns, labels: {kubernetes.io/service-name: other, service.kubernetes.io/service-proxy-name: other}}
addressType: IPv4
endpoints: [{addresses: [10.244.0.6]}]
ports: [{name: p, port: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: headless, namespace: ns, labels: {service.kubernetes.io/headless: ""}}
spec: {clusterIP: None, ports: [{name: p, port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: headless-1, namespace: ns, labels: {kubernetes.io/service-name: headless, service.kubernetes.io/headless: ""}}
addressType: IPv4
endpoints: [{addresses: [10.244.0.8]}]
ports: [{name: p, port: 8080}]
`
	got, _ := dryRunManifest(t, cluster)
	for _, want := range []string{"-d 10.96.0.10 ", "--to-destination 10.244.0.5:8080"} {
		if !strings.Contains(got, want) {
			t.Errorf("the output lacks %q:\n%s", want, got)
		}
	}
	for what, dont := range map[string]string{
		"the Service of another proxy":      "10.96.0.11",
		"the endpoint of a headless slice":  "10.244.0.77",
		"the endpoint of the headless one":  "10.244.0.8",
		"the other proxy's Service's slice": "10.244.0.6",
	} {
		if strings.Contains(got, dont) {
			t.Errorf("the output holds %s (%s):\n%s", what, dont, got)
		}
	}
}

// TestDryRunRefusesInvalidManifests checks that --manifests refuses what
// an API server's validation would, each object with a log line naming it,
// the others still programmed; and that a name with a line break cannot
// forge a log line.
func TestDryRunRefusesInvalidManifests(t *testing.T) {
	const forged = `E0229 00:00:00.000000       1 forged.go:1] owned`
	cluster := nodeA + `apiVersion: v1
kind: Service
metadata: {name: hc, namespace: ns}
spec: {clusterIP: 10.96.0.20, ports: [{port: 80}], healthCheckNodePort: 30001}
---
apiVersion: v1
kind: Service
metadata: {name: np, namespace: ns}
spec: {clusterIP: 10.96.0.21, ports: [{port: 80, nodePort: 30080}]}
---
apiVersion: v1
kind: Service
metadata: {name: "evil\n` + forged + `", namespace: ns}
spec: {clusterIP: 10.96.0.22, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: good, namespace: ns}
spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}
`
	got, log := dryRunManifest(t, cluster)
	for _, want := range []string{
		`"Refusing an invalid manifest object" err="Service \"hc\" is invalid: spec.healthCheckNodePort: Invalid value: 30001: may only be set when`,
		`kind="Service" object="ns/hc"`,
		`"Refusing an invalid manifest object" err="Service \"np\" is invalid: spec.ports[0].nodePort: Forbidden`,
		`object="ns/\"evil\\nE0229`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %q:\n%s", want, log)
		}
	}
	for _, line := range strings.Split(log, "\n") {
		if strings.HasPrefix(strings.TrimLeft(line, " \t"), "E0229") {
			t.Errorf("a forged line in the log:\n%s", log)
		}
	}
	if !strings.Contains(got, "-d 10.96.0.10 ") {
		t.Errorf("the valid Service's rules are missing:\n%s", got)
	}
	for _, ip := range []string{"10.96.0.20", "10.96.0.21", "10.96.0.22"} {
		if strings.Contains(got, ip) {
			t.Errorf("a refused Service (%s) was programmed:\n%s", ip, got)
		}
	}
}

// TestManifestWatchSelectorTransitions runs the proxier on the fakes and
// edits the demo cluster: a Service that gains the label of another proxy,
// and an EndpointSlice that gains the headless label, leave the rules and
// come back when they lose it, as the watch of an API server sends them
// DELETED and ADDED; and a change to another Node (here a deletion taint)
// does not reach this node's health, since the node informer selects this
// node by name.
func TestManifestWatchSelectorTransitions(t *testing.T) {
	node := newFakeNode(t)
	r := startOnFakes(t, node)
	healthURL := node.url(t, "127.0.0.1:10256", "/healthz")
	const webRule = `-d 10.96.0.10/32 -p tcp -m comment --comment "shop/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-67NZLRHBNDSAWJRO`
	// api's endpoint on this node, which only its slice api-1 holds.
	const apiEndpoint = "10.244.1.30:8443"
	webProgrammed := func(want bool) func() error {
		return func() error {
			rules := node.ipt4.Rules(iptables.TableNAT, iptables.KubeServicesChain)
			if slices.Contains(rules, webRule) != want {
				return fmt.Errorf("web programmed: %v, want %v; KUBE-SERVICES holds %q", !want, want, rules)
			}
			if got := strings.Contains(node.ipt4.Dump(), apiEndpoint); got != want {
				return fmt.Errorf("api's endpoint %s programmed: %v, want %v", apiEndpoint, got, want)
			}
			return nil
		}
	}
	eventually(t, 10*time.Second, "first sync", webProgrammed(true))
	checkHTTP(t, healthURL, 200, `"healthy":true`)

	edited := strings.Replace(r.demo, "metadata: {name: web, namespace: shop}\n",
		"metadata: {name: web, namespace: shop, labels: {service.kubernetes.io/service-proxy-name: other}}\n", 1)
	edited = strings.Replace(edited, "kind: Node\nmetadata:\n  name: node-b\n", "kind: Node\nspec: {taints: [{key: ToBeDeletedByClusterAutoscaler, effect: NoSchedule}]}\nmetadata:\n  name: node-b\n", 1)
	edited = strings.Replace(edited, "  name: api-1\n  namespace: shop\n  labels: {kubernetes.io/service-name: api}\n",
		"  name: api-1\n  namespace: shop\n  labels: {kubernetes.io/service-name: api, service.kubernetes.io/headless: \"\"}\n", 1)
	if strings.Count(edited, "\n") != strings.Count(r.demo, "\n")+1 || !strings.Contains(edited, "service-proxy-name") || !strings.Contains(edited, "service-name: api, service.kubernetes.io/headless") {
		t.Fatal("the demo file changed: the edit does not apply")
	}
	r.edit(t, edited)
	eventually(t, 10*time.Second, "web leaving", webProgrammed(false))
	checkHTTP(t, healthURL, 200, `"healthy":true`)

	r.edit(t, r.demo)
	eventually(t, 10*time.Second, "web coming back", webProgrammed(true))
	r.stop(t)
}
