package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/proxykit/proxykit/conntrack"
)

// TestWriteConfigRoundTrip checks --write-config-to: it writes a
// KubeProxyConfiguration and does nothing else (no environment is given),
// and the file read back with --config gives the options it was written
// from, whether these came from flags or from a file.
func TestWriteConfigRoundTrip(t *testing.T) {
	t.Cleanup(func() {
		if _, err := parseOptions([]string{"-v", "0"}, io.Discard); err != nil {
			t.Error(err)
		}
	})
	for _, args := range [][]string{
		nil,
		{"--proxy-mode", "ipvs", "--ipvs-scheduler", "lc", "--ipvs-sync-period", "1m", "--ipvs-min-sync-period", "2s",
			"--iptables-masquerade-bit", "15", "--masquerade-all", "--cluster-cidr", "10.244.0.0/16,fd00::/64",
			"--nodeport-addresses", "192.168.0.0/24", "--kube-api-qps", "20", "--kube-api-burst", "40",
			"--kubeconfig", "/etc/k.conf", "--hostname-override", "node-a", "--healthz-bind-address", "[::]:1",
			"--conntrack-max-per-core", "100", "--conntrack-min", "5", "--conntrack-udp-timeout", "30s",
			"--conntrack-tcp-timeout-close-wait", "0s", "--conntrack-tcp-be-liberal", "-v", "3"},
		{"--proxy-mode", "nftables", "--iptables-sync-period", "45s", "--iptables-min-sync-period", "3s",
			"--nodeport-addresses", "all", "--iptables-localhost-nodeports=false", "--metrics-bind-address", "0.0.0.0:9"},
		{"--config", "testdata/config/ipvs.yaml"},
		{"--config", "testdata/config/nftables.yaml"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "written.yaml")
			want, err := parseOptions(append(args, "--write-config-to", path), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if err := run(context.Background(), want, nil); err != nil {
				t.Fatal(err)
			}
			got, err := parseOptions([]string{"--config", path}, io.Discard)
			if err != nil {
				data, _ := os.ReadFile(path)
				t.Fatalf("reading the written file back: %v\n%s", err, data)
			}
			// Without a file or flags, kube-proxy's timeouts.
			if want.conntrack == nil {
				want.conntrack = &conntrack.Tuning{TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour}
			}
			if diff := cmp.Diff(want, got, cmp.AllowUnexported(options{}),
				cmpopts.IgnoreFields(options{}, "names", "config", "writeConfigTo", "unsupported"),
				cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				data, _ := os.ReadFile(path)
				t.Errorf("options read back (-written +read):\n%s\nfile:\n%s", diff, data)
			}
		})
	}
}

// TestConfigz checks /configz as kube-proxy serves it: the effective
// configuration, as JSON under its API group, for GET; nothing else.
func TestConfigz(t *testing.T) {
	o, err := parseOptions([]string{"--proxy-mode", "nftables", "--cluster-cidr", "10.244.0.0/16", "--hostname-override", "node-a"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	h, err := configzHandler(effectiveConfig(o))
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/configz", nil))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("GET: %d %q, want 200 application/json", rec.Code, rec.Header().Get("Content-Type"))
	}
	var got map[string]kubeproxyconfig.KubeProxyConfiguration
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatalf("GET: %v\n%s", err, rec.Body)
	}
	cfg, ok := got["kubeproxy.config.k8s.io"]
	if !ok || cfg.Mode != "nftables" || cfg.ClusterCIDR != "10.244.0.0/16" || cfg.HostnameOverride != "node-a" {
		t.Errorf("GET: %s, want the effective configuration under kubeproxy.config.k8s.io", rec.Body)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/configz", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d, want 405", rec.Code)
	}
}
