package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
)

// demoRuns are the demo commands and the golden files of their output.
var demoRuns = []struct{ command, golden string }{
	{demoCommand, "demo-cluster.dry-run.golden"},
	{demoIPVSCommand, "demo-cluster.ipvs.dry-run.golden"},
	{demoNFTablesCommand, "demo-cluster.nftables.dry-run.golden"},
	{demoEBPFCommand, "demo-cluster.ebpf.dry-run.golden"},
}

// demoArgs are command's flags, with the manifests path as seen from this
// package's directory when local is set.
func demoArgs(t *testing.T, command string, local bool) []string {
	t.Helper()
	const prefix = "go run ./examples/proxier "
	if !strings.HasPrefix(command, prefix) {
		t.Fatalf("demo command %q does not start with %q", command, prefix)
	}
	args := strings.Fields(strings.TrimPrefix(command, prefix))
	for i, a := range args {
		if local {
			args[i] = strings.Replace(a, "examples/proxier/testdata", "testdata", 1)
		}
	}
	return args
}

// TestDryRunDemoCluster checks the README's first command, and its IPVS
// mode variant: the output for the demo cluster is the golden file, it
// touches nothing (the environment fails the test if iptables, conntrack,
// the kernel, IPVS or the host's addresses are used), and the READMEs and
// the demo file show the commands.
func TestDryRunDemoCluster(t *testing.T) {
	for _, demo := range demoRuns {
		t.Run(demo.golden, func(t *testing.T) {
			var out bytes.Buffer
			log, err := runArgs(t, dryRunEnvironment(t, &out), demoArgs(t, demo.command, true)...)
			if err != nil {
				t.Fatalf("dry run: %v\n%s", err, log)
			}
			checkGolden(t, demo.golden, out.Bytes())
		})
	}
	for path, commands := range map[string][]string{
		"../../README.md":            {demoCommand},
		"../../doc.go":               {demoCommand},
		"testdata/demo-cluster.yaml": {demoCommand},
		"README.md":                  {demoCommand, demoIPVSCommand, demoNFTablesCommand},
		"doc.go":                     {demoCommand, demoIPVSCommand, demoNFTablesCommand},
	} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range commands {
			if !bytes.Contains(data, []byte(c)) {
				t.Errorf("%s does not show the command %q", path, c)
			}
		}
	}
}

// TestDryRunBinary runs the built proxier as the README says, from the
// repository's root, with an empty PATH (so that running any program, such
// as iptables, fails) and, when the test runs as root, as the user nobody:
// the output must still be the golden one, in both modes.
func TestDryRunBinary(t *testing.T) {
	bin := proxierBinary(t)
	noPath := t.TempDir()
	for _, demo := range demoRuns {
		cmd := exec.Command(bin, demoArgs(t, demo.command, false)...)
		cmd.Dir = filepath.Join("..", "..")
		cmd.Env = []string{"PATH=" + noPath, "HOME=/nonexistent"}
		if os.Geteuid() == 0 {
			if err := os.Chmod(noPath, 0o755); err != nil {
				t.Fatal(err)
			}
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		}
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, stderr.String())
		}
		want, err := os.ReadFile(filepath.Join("testdata", demo.golden))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(want, stdout.Bytes()) {
			t.Errorf("the binary's output differs from %s:\n%s", demo.golden, cmp.Diff(string(want), stdout.String()))
		}
	}
}

// TestDryRunFamilies checks that the IP families proxied are those of the
// node's addresses: IPv4 only, IPv6 only, or both, each with its own rules.
func TestDryRunFamilies(t *testing.T) {
	const services = `
apiVersion: v1
kind: Service
metadata: {name: v4, namespace: ns}
spec:
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ports: [{name: p, port: 80, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: v6, namespace: ns}
spec:
  clusterIP: fd00:96::10
  clusterIPs: [fd00:96::10]
  ipFamilies: [IPv6]
  ports: [{name: p, port: 80, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: dual, namespace: ns}
spec:
  clusterIP: 10.96.0.11
  clusterIPs: [10.96.0.11, fd00:96::11]
  ipFamilies: [IPv4, IPv6]
  ports: [{name: p, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dual-v4, namespace: ns, labels: {kubernetes.io/service-name: dual}}
addressType: IPv4
endpoints: [{addresses: [10.244.0.5]}]
ports: [{name: p, port: 8080, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dual-v6, namespace: ns, labels: {kubernetes.io/service-name: dual}}
addressType: IPv6
endpoints: [{addresses: ["fd00:244::5"]}]
ports: [{name: p, port: 8080, protocol: TCP}]
`
	node := func(addrs ...string) string {
		s := "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\nstatus:\n  addresses:\n"
		for _, a := range addrs {
			s += "  - {type: InternalIP, address: \"" + a + "\"}\n"
		}
		return s
	}
	for _, tc := range []struct {
		name       string
		mode       string
		node       string
		want, dont []string
		// first is printed before second.
		first, second string
	}{{
		name: "IPv4 only",
		node: node("192.168.0.1"),
		want: []string{"# IPv4: iptables-restore input\n", "-d 10.96.0.10", "-d 10.96.0.11", "--to-destination 10.244.0.5:8080"},
		dont: []string{"# IPv6", "fd00:"},
	}, {
		name: "IPv6 only",
		node: node("fd00::1"),
		want: []string{"# IPv6: ip6tables-restore input\n", "-d fd00:96::10", "-d fd00:96::11", "--to-destination [fd00:244::5]:8080"},
		dont: []string{"# IPv4", "10.96.0."},
	}, {
		name:  "dual-stack, IPv6 primary",
		node:  node("fd00::1", "192.168.0.1"),
		want:  []string{"# IPv6: ip6tables-restore input\n", "# IPv4: iptables-restore input\n", "-d fd00:96::11", "-d 10.96.0.11"},
		first: "# IPv6", second: "# IPv4",
	}, {
		name: "IPVS mode, IPv4 only",
		mode: modeIPVS,
		node: node("192.168.0.1"),
		want: []string{"# IPVS virtual servers (IPv4)\n", "TCP 10.96.0.10:80 rr bound\n", "TCP 10.96.0.11:80 rr bound\n  -> 10.244.0.5:8080 weight 1\n", "# iptables-restore input (IPv4)\n"},
		dont: []string{"(IPv6)", "fd00:"},
	}, {
		name: "IPVS mode, IPv6 only",
		mode: modeIPVS,
		node: node("fd00::1"),
		want: []string{"# IPVS virtual servers (IPv6)\n", "TCP [fd00:96::10]:80 rr bound\n", "TCP [fd00:96::11]:80 rr bound\n  -> [fd00:244::5]:8080 weight 1\n", "create KUBE-6-CLUSTER-IP hash:ip,port family inet6", "# ip6tables-restore input (IPv6)\n"},
		dont: []string{"(IPv4)", "10.96.0."},
	}, {
		name: "ebpf mode, dual-stack: nftables' transactions, then the socket load balancer's maps",
		mode: modeEBPF,
		node: node("192.168.0.1", "fd00::1"),
		want: []string{"# IPv4: ebpf maps of the socket load balancer: 2 services, 1 slots, 1 endpoints\n", "service 10.96.0.11:80/TCP -> set 1 count 1 affinity 0 cluster-ip # ns/dual:p\n",
			"# IPv6: ebpf maps of the socket load balancer: 2 services, 1 slots, 1 endpoints\n", "service [fd00:96::11]:80/TCP -> set 1 count 1 affinity 0 cluster-ip # ns/dual:p\n",
			"endpoint 1 -> set 1 [fd00:244::5]:8080\n", "# IPv6: nft -f input for table ip6 kube-proxy\n"},
		first: "# IPv6: nft -f input", second: "# IPv4: ebpf maps",
	}, {
		name:  "IPVS mode, dual-stack, IPv6 primary",
		mode:  modeIPVS,
		node:  node("fd00::1", "192.168.0.1"),
		want:  []string{"TCP [fd00:96::11]:80 rr bound\n  -> [fd00:244::5]:8080 weight 1\n", "TCP 10.96.0.11:80 rr bound\n  -> 10.244.0.5:8080 weight 1\n", "# ip6tables-restore input (IPv6)\n", "# iptables-restore input (IPv4)\n"},
		first: "# IPVS virtual servers (IPv6)", second: "# IPVS virtual servers (IPv4)",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "cluster.yaml"), []byte(services+"---\n"+tc.node), 0o644); err != nil {
				t.Fatal(err)
			}
			args := []string{"--manifests", dir, "--dry-run", "--hostname-override", "node-a"}
			if tc.mode != "" {
				args = append(args, "--mode", tc.mode)
			}
			var out bytes.Buffer
			log, err := runArgs(t, dryRunEnvironment(t, &out), args...)
			if err != nil {
				t.Fatalf("dry run: %v\n%s", err, log)
			}
			got := out.String()
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("output lacks %q:\n%s", w, got)
				}
			}
			for _, d := range tc.dont {
				if strings.Contains(got, d) {
					t.Errorf("output has %q:\n%s", d, got)
				}
			}
			if tc.first != "" && !(strings.Contains(got, tc.first) && strings.Index(got, tc.first) < strings.Index(got, tc.second)) {
				t.Errorf("the primary family (IPv6, the node's first address) is not printed first")
			}
		})
	}
}

// TestDryRunBadManifests checks that a bad document is reported with its
// file and position and that the rest of the file still loads.
func TestDryRunBadManifests(t *testing.T) {
	dir := t.TempDir()
	const cluster = `apiVersion: v1
kind: Node
metadata: {name: node-a}
status: {addresses: [{type: InternalIP, address: 192.168.0.1}]}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: not-a-service}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: ns}
spec:
  clusterIP: 10.96.0.10
  ports: [{name: p, port: 80, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: [broken
`
	path := filepath.Join(dir, "cluster.yaml")
	if err := os.WriteFile(path, []byte(cluster), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	log, err := runArgs(t, dryRunEnvironment(t, &out), "--manifests", dir, "--dry-run", "--hostname-override", "node-a")
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, log)
	}
	for _, want := range []string{
		`"Skipping a manifest document" err="unsupported kind ConfigMap`,
		`file="` + path + `" document=2`,
		`file="` + path + `" document=4`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	if !strings.Contains(out.String(), "-d 10.96.0.10") {
		t.Errorf("the good Service's rules are missing:\n%s", out.String())
	}
}

// TestDryRunNFTablesChecks checks that nftables mode's dry run prints what
// nft -f takes, both families one after the other: the real nft --check
// accepts it in an empty namespace, and applies nothing.
func TestDryRunNFTablesChecks(t *testing.T) {
	kerneltest.Require(t, "nft")
	dir := t.TempDir()
	manifest, err := os.ReadFile(filepath.Join("testdata", "demo-cluster.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// The demo's Node, with an IPv6 address too: both families' tables.
	dual := strings.Replace(string(manifest), "- {type: InternalIP, address: 192.168.10.11}", "- {type: InternalIP, address: 192.168.10.11}\n  - {type: InternalIP, address: \"fd00:10::11\"}", 1)
	if dual == string(manifest) {
		t.Fatal("the demo cluster's Node address is not where the test expects it")
	}
	if err := os.WriteFile(filepath.Join(dir, "cluster.yaml"), []byte(dual), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	log, err := runArgs(t, dryRunEnvironment(t, &out), "--mode", "nftables", "--dry-run", "--manifests", dir, "--hostname-override", "node-a")
	if err != nil {
		t.Fatalf("dry run: %v\n%s", err, log)
	}
	for _, header := range []string{"# IPv4: nft -f input for table ip kube-proxy\n", "# IPv6: nft -f input for table ip6 kube-proxy\n"} {
		if !strings.Contains(out.String(), header) {
			t.Errorf("the dry run lacks %q:\n%s", header, out.String())
		}
	}
	kerneltest.CheckNFT(t, out.Bytes())
}
