package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/explain"
)

const explainManifests = "testdata/explain/cluster.yaml"

// explainServiceCmd runs `proxier explain service ARGS` without tracing
// the ways in: these tests read manifests, on no node.
func explainServiceCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return explainMain(ctx, append([]string{"service", "--trace=false"}, args...), &environment{stdout: stdout}, stderr)
}

// TestExplainServiceCLI runs the command on the manifests of
// testdata/explain, one Service per fault, and checks the verdict of
// each endpoint in the JSON output.
func TestExplainServiceCLI(t *testing.T) {
	tests := []struct {
		target string
		// want is "address reason" per endpoint ("used" when used).
		want           []string
		wantNotProxied bool
	}{
		{"shop/web", []string{"10.244.1.10 used", "10.244.2.10 used"}, false},
		{"shop/web:http", []string{"10.244.1.10 used", "10.244.2.10 used"}, false},
		{"shop/notready", []string{"10.244.1.20 NotReady"}, false},
		{"shop/portname", []string{"10.244.1.30 PortNameMismatch"}, false},
		{"shop/unlabelled", []string{"10.244.1.40 SliceWithoutServiceName"}, false},
		{"shop/other", []string{"10.244.1.50 ServiceNotProxied"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.target, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := explainServiceCmd(context.Background(), []string{tt.target, "--manifests", explainManifests, "--hostname-override", "node-a", "-o", "json"}, &stdout, &stderr)
			if code != 0 {
				t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
			}
			var r explain.ServiceReport
			if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
				t.Fatalf("%v in:\n%s", err, stdout.String())
			}
			var got []string
			for _, p := range r.Ports {
				for _, e := range p.Endpoints {
					v := string(e.Internal.Reason)
					if e.Internal.Used {
						v = "used"
					}
					got = append(got, e.Address+" "+v)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("verdicts (-want +got):\n%s", diff)
			}
			if (len(r.NotProxied) > 0) != tt.wantNotProxied {
				t.Errorf("NotProxied = %q", r.NotProxied)
			}
		})
	}
}

func TestExplainServiceCLIText(t *testing.T) {
	var stdout, stderr bytes.Buffer
	// Flags first, the target last, with kube-proxy's spelling of the mode.
	code := explainServiceCmd(context.Background(), []string{"--manifests", explainManifests, "--hostname-override", "node-a", "--proxy-mode", "nftables", "shop/notready"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
	}
	for _, want := range []string{
		"Service shop/notready (ClusterIP) on node node-a in zone zone-1",
		"10.244.1.20:8080  notready-1  node-a  -     no     no       no           no: NotReady",
		"10.244.1.20:8080 internal: NotReady: not ready and not serving",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, stdout.String())
		}
	}
}

func TestExplainServiceCLIErrors(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantErr  string
	}{
		{"service not found", []string{"shop/nope", "--manifests", explainManifests, "--hostname-override", "node-a"}, 1, "service shop/nope not found"},
		{"port not found", []string{"shop/web:9999", "--manifests", explainManifests, "--hostname-override", "node-a"}, 1, "service shop/web has no port 9999"},
		{"no API access", []string{"shop/web", "--kubeconfig", "testdata/explain/no-such-kubeconfig", "--hostname-override", "node-a"}, 1, "cannot read the cluster"},
		{"no target", []string{"--manifests", explainManifests}, 2, "missing NAMESPACE/NAME[:PORT]"},
		{"bad target", []string{"web"}, 2, "want NAMESPACE/NAME[:PORT]"},
		{"bad output", []string{"shop/web", "-o", "yaml"}, 2, `-o "yaml": want text or json`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := explainServiceCmd(context.Background(), tt.args, &stdout, &stderr)
			if code != tt.wantCode || !strings.Contains(stderr.String(), tt.wantErr) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, stderr.String(), tt.wantCode, tt.wantErr)
			}
			if stdout.Len() > 0 {
				t.Errorf("stdout: %q", stdout.String())
			}
		})
	}
}

// TestExplainServiceCLINoNode: without a Node object the command still
// explains, says so on stderr, and uses no zone.
func TestExplainServiceCLINoNode(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := explainServiceCmd(context.Background(), []string{"shop/web", "--manifests", explainManifests, "--hostname-override", "node-z", "-o", "json"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
	}
	if want := `node node-z not found: explaining without its zone and addresses`; !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
	}
	var r explain.ServiceReport
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	if r.Node != "node-z" || r.Zone != "" || !r.Proxied {
		t.Errorf("report for node %q zone %q proxied %t", r.Node, r.Zone, r.Proxied)
	}
}
