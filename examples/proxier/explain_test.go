package main

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/explain"
)

// TestExplainCommandLine checks how `proxier explain` reads its command
// line: the proxier's flags (and kube-proxy's spellings of them) before,
// between and after the view's argument, explain's own flags, and the
// exit status of what it refuses.
func TestExplainCommandLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		// want is what parsing gives, as "mode prefix table from output
		// netns backend args"; err is part of the error instead.
		want, err string
	}{
		{name: "defaults", args: []string{"10.96.0.10:80/tcp"}, want: "iptables KUBE kube-proxy node text   [10.96.0.10:80/tcp]"},
		{name: "flags after the argument", args: []string{"10.96.0.10:53/udp", "--from", "pod", "-o", "json", "--proxy-mode", "nftables", "--netns", "/run/netns/x"},
			want: "nftables KUBE kube-proxy pod json /run/netns/x  [10.96.0.10:53/udp]"},
		{name: "flags around it, a chain prefix", args: []string{"--mode", "iptables", "--chain-prefix", "PROXYB", "[fd00::1]:80", "--iptables-backend", "legacy"},
			err: "--chain-prefix"},
		{name: "a chain prefix", args: []string{"--mode", "iptables", "--chain-prefix", "PXB", "[fd00::1]:80", "--iptables-backend", "legacy"},
			want: "iptables PXB pxb-proxy node text  legacy [[fd00::1]:80]"},
		{name: "no destination", args: nil, err: "missing DEST_IP:PORT/PROTO"},
		{name: "two destinations", args: []string{"10.96.0.10:80", "10.96.0.11:80"}, err: "want 1 argument(s)"},
		{name: "an output format it has not", args: []string{"10.96.0.10:80", "-o", "yaml"}, err: `-o "yaml"`},
		{name: "IPVS mode", args: []string{"10.96.0.10:80", "--proxy-mode", "ipvs"}, err: "IPVS virtual servers are not read"},
		{name: "an unknown backend", args: []string{"10.96.0.10:80", "--iptables-backend", "ebpf"}, err: "--iptables-backend"},
		{name: "an unknown flag", args: []string{"10.96.0.10:80", "--frobnicate"}, err: "frobnicate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := parseExplainOptions("packet", tc.args, io.Discard)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("parse %q: %v, want an error containing %q", tc.args, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("parse %q: %v", tc.args, err)
			}
			got := strings.Join([]string{e.mode, e.chainPrefix, e.nftTable, e.from, e.output, e.netns, e.backend}, " ") + " " + strings.Join([]string{"[" + strings.Join(e.args, " ") + "]"}, "")
			if got != tc.want {
				t.Errorf("parse %q:\n got %s\nwant %s", tc.args, got, tc.want)
			}
		})
	}
}

// TestExplainExitStatus: the views and their exit statuses, without a
// kernel: a bad command line is 2, what cannot be explained 1 with a
// message that says why.
func TestExplainExitStatus(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		status int
		stderr string
	}{
		{nil, 2, "Usage:"},
		{[]string{"--help"}, 0, "Usage:"},
		{[]string{"route", "10.96.0.10:80"}, 2, `unknown view "route"`},
		{[]string{"packet", "10.96.0.10"}, 1, "want ADDR:PORT/PROTO"},
		{[]string{"packet", "10.96.0.10:80", "--from", "somewhere"}, 1, "want node, pod, outside or an IP address"},
		{[]string{"packet", "10.96.0.10:80", "--netns", "/nonexistent/netns"}, 1, "/nonexistent/netns"},
		{[]string{"service", "ns/name"}, 1, "cannot read the cluster"},
		{[]string{"drift", "extra"}, 2, "want 0 argument(s)"},
	} {
		var stdout, stderr bytes.Buffer
		status := explainMain(testLogger(&logBuffer{}, 0), tc.args, realEnvironment(&stdout), &stderr)
		if status != tc.status || !strings.Contains(stderr.String(), tc.stderr) {
			t.Errorf("explain %q: status %d, stderr %q; want %d and %q", tc.args, status, stderr.String(), tc.status, tc.stderr)
		}
	}
}

// TestExplainE2E programs the end-to-end cluster into a node namespace
// with the proxier itself (--once), in each mode and iptables backend,
// and explains it from outside the namespace (--netns): a service without
// endpoints rejected by its rule, a cluster IP's endpoints with their
// probabilities, a node port masqueraded, an external traffic policy
// Local served by the node's own endpoint alone, no drift from what the
// proxier renders for the same manifests, and a rule added by hand found
// as drift.
func TestExplainE2E(t *testing.T) {
	forEachE2EMode(t, false, func(t *testing.T, m e2eMode) {
		k := newE2EModeNode(t, m, e2eScenario(), false)
		common := []string{"--mode", m.mode, "--manifests", k.dir, "--hostname-override", "node-a", "--cluster-cidr", e2eClusterCIDR}
		if err := k.runProxier(append([]string{"--once"}, common...)...); err != nil {
			t.Fatalf("--once: %v\n%s", err, k.log.String())
		}
		explainArgs := append(common, "--netns", "/run/netns/"+k.node.Name)
		// run runs the view with the flags, then args, which win.
		run := func(t *testing.T, view string, args ...string) (int, string, string) {
			var stdout, stderr bytes.Buffer
			all := append(append([]string{view}, explainArgs...), args...)
			status := explainMain(testLogger(&logBuffer{}, 0), all, realEnvironment(&stdout), &stderr)
			return status, stdout.String(), stderr.String()
		}
		type seen struct {
			Verdict  explain.Verdict
			Endpoint string
			Masq     bool
			P        float64
		}
		for _, tc := range []struct {
			name, dest, from string
			want             []seen
			rule             string
		}{
			{"no endpoints", "10.96.0.17:80/tcp", "pod", []seen{{Verdict: explain.Reject, P: 1}}, "10.96.0.17"},
			{"cluster IP", "10.96.0.10:80/tcp", "pod", []seen{
				{explain.Accept, "10.244.0.11:8080", false, 0.5}, {explain.Accept, "10.244.0.12:8080", false, 0.5}}, ""},
			{"UDP cluster IP", "10.96.0.10:80/udp", "pod", []seen{
				{explain.Accept, "10.244.0.11:8080", false, 0.5}, {explain.Accept, "10.244.0.12:8080", false, 0.5}}, ""},
			{"node port from a client", "10.1.0.1:30080/tcp", e2eClientIP, []seen{
				{explain.Accept, "10.244.0.11:8080", true, 0.5}, {explain.Accept, "10.244.0.12:8080", true, 0.5}}, ""},
			{"Local policy: the node's endpoint alone", "203.0.113.15:80/tcp", "outside", []seen{{explain.Accept, "10.244.0.11:8080", false, 1}}, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				status, out, stderr := run(t, "packet", tc.dest, "--from", tc.from, "-o", "json")
				if status != 0 {
					t.Fatalf("status %d: %s", status, stderr)
				}
				var ex explain.Explanation
				if err := json.Unmarshal([]byte(out), &ex); err != nil {
					t.Fatalf("%v:\n%s", err, out)
				}
				var got []seen
				for _, o := range ex.Outcomes {
					s := seen{Verdict: o.Verdict, Masq: o.Masquerade, P: math.Round(o.Probability*1000) / 1000}
					if o.Endpoint.IsValid() {
						s.Endpoint = o.Endpoint.String()
					}
					got = append(got, s)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("outcomes (-want +got):\n%s\n%s", diff, out)
				}
				if tc.rule != "" && (len(ex.Outcomes) == 0 || !strings.Contains(ex.Outcomes[0].Rule, tc.rule)) {
					t.Errorf("the deciding rule does not name %s:\n%s", tc.rule, out)
				}
			})
		}

		// The service view traces each way in through the same rules:
		// the node port of np from outside reaches both endpoints, as
		// the trackers decide, with nothing differing.
		t.Run("service ways in", func(t *testing.T) {
			status, out, stderr := run(t, "service", e2eNS+"/np", "-o", "json")
			if status != 0 {
				t.Fatalf("status %d: %s", status, stderr)
			}
			var r explain.ServiceReport
			if err := json.Unmarshal([]byte(out), &r); err != nil {
				t.Fatalf("%v:\n%s", err, out)
			}
			got := map[string][]string{}
			for _, p := range r.Ports {
				for _, wi := range p.WaysIn {
					for _, tr := range wi.Traces {
						key := wi.Kind + " from " + string(tr.From.Kind)
						if tr.Error != "" || tr.Differs {
							t.Errorf("%s: error %q, differs %t", key, tr.Error, tr.Differs)
						}
						for _, o := range tr.Outcomes {
							got[key] = append(got[key], o.Endpoint.String())
						}
					}
				}
			}
			both := []string{"10.244.0.11:8080", "10.244.0.12:8080"}
			want := map[string][]string{"ClusterIP from pod": both, "ClusterIP from node": both,
				"NodePort from pod": both, "NodePort from node": both, "NodePort from outside": both}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("traced ways in (-want +got):\n%s\n%s", diff, out)
			}
			status, text, stderr := run(t, "service", e2eNS+"/np")
			if status != 0 || !strings.Contains(text, "(outside) to 10.1.0.1:30080 in the live rules: p=0.5 ACCEPT, DNAT to 10.244.0.1") {
				t.Errorf("text: status %d\n%s\n%s", status, text, stderr)
			}
		})

		status, out, stderr := run(t, "drift")
		if status != 0 || !strings.Contains(out, "0 differ; 0 missing, 0 extra") {
			t.Fatalf("drift of the rules the proxier wrote: status %d\n%s\n%s", status, out, stderr)
		}
		status, out, stderr = run(t, "drift", "-o", "json")
		var drifts []explain.Drift
		if err := json.Unmarshal([]byte(out), &drifts); status != 0 || err != nil || len(drifts) != 1 || !drifts[0].Empty() || drifts[0].Traced == 0 {
			t.Fatalf("drift as JSON: status %d, %v\n%s\n%s", status, err, out, stderr)
		}
		// A rule added by hand in front of the proxy's: the cluster IP no
		// longer reaches its endpoints.
		if m.mode == modeNFTables {
			k.nft(t, "insert", "rule", "ip", "kube-proxy", "services", "ip", "daddr", "10.96.0.10", "tcp", "dport", "80", "drop")
		} else {
			k.iptables(t, "IPv4", "-t", "nat", "-I", "KUBE-SERVICES", "-d", "10.96.0.10/32", "-p", "tcp", "--dport", "80", "-j", "RETURN")
		}
		status, out, stderr = run(t, "drift")
		if status != 0 || !strings.Contains(out, "packet tcp 10.244.0.2 (pod) -> 10.96.0.10:80") || !strings.Contains(out, "extra: ") {
			t.Errorf("drift after a rule added by hand: status %d\n%s\n%s", status, out, stderr)
		}

		if m.mode != modeNFTables {
			// Nothing of nftables mode on this node: the error names
			// the table.
			status, _, stderr = run(t, "packet", "10.96.0.10:80", "--mode", "nftables")
			if status != 1 || !strings.Contains(stderr, "nftables table ip kube-proxy") {
				t.Errorf("nftables mode on an iptables node: status %d, %s", status, stderr)
			}
		}
	})
}
