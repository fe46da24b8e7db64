package main

import (
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// metricRow is a row of the README's metric table: a metric family that
// kube-proxy v1.37.2 serves on /metrics (read from k8s.io/kubernetes'
// pkg/proxy/metrics and k8s.io/component-base's restclient adapter and
// legacy registry), and whether this proxier serves it.
type metricRow struct {
	name    string // a family, or a prefix ending in "*" for a group
	typ     string // counter, gauge, histogram; "" for a group
	labels  []string
	buckets []float64 // kube-proxy's upper bounds, for a histogram
	// kubeProxy are the modes kube-proxy serves it in.
	kubeProxy string
	// served are the modes this proxier serves it in; none: not served.
	served []string
	// event, when set, is what gives the family its first series (a
	// family with no series is not on /metrics, in kube-proxy as here),
	// and the test that shows it served; otherwise it is there after
	// the first sync and a GET of /healthz and /livez.
	event, test string
	// note says why it is not served, or how it differs.
	note string
}

var (
	allModes      = []string{"iptables", "ipvs", "nftables", "ebpf"}
	syncBounds    = []float64{0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096, 8.192, 16.384}
	restBounds    = []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60}
	sizeBounds    = []float64{64, 256, 512, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216}
	rotateBounds  = []float64{600, 1800, 3600, 14400, 86400, 604800, 2592000, 7776000, 15552000, 31104000, 124416000}
	programBounds = func() []float64 {
		b := []float64{0.25, 0.5}
		for i := 1; i <= 59; i++ {
			b = append(b, float64(i))
		}
		for i := 0; i < 12; i++ {
			b = append(b, float64(60+5*i))
		}
		for i := 0; i < 7; i++ {
			b = append(b, float64(120+30*i))
		}
		return b
	}()
)

const (
	onRequest   = "a request to the API server"
	onDo        = "a request other than a watch (the informers' lists and watches count only in rest_client_requests_total)"
	requestTest = "proxier.TestRegisterClientMetrics"
	notWindows  = "Windows' kernelspace mode; proxykit is Linux only"
	notNFTLocal = "nftables mode's localhost node-port proxy, behind kube-proxy's alpha gate KubeProxyNFTablesLocalhostNodePorts (off by default); proxykit's nftables mode has no such proxy"
	notMeta     = "component-base's stability framework; proxykit registers on a plain client_golang registry and has no stability levels"
	notEBPFNFT  = "in ebpf mode, nftables mode's beside the socket load balancer"
)

// metricTable is every metric family kube-proxy v1.37.2 serves on Linux
// and Windows, then proxykit's own.
var metricTable = []metricRow{
	{name: "kubeproxy_sync_proxy_rules_duration_seconds", typ: "histogram", labels: []string{"ip_family"}, buckets: syncBounds, kubeProxy: "all", served: allModes},
	{name: "kubeproxy_sync_full_proxy_rules_duration_seconds", typ: "histogram", labels: []string{"ip_family"}, buckets: syncBounds, kubeProxy: "iptables, nftables", served: allModes,
		note: "also in ipvs mode, whose syncs are all full"},
	{name: "kubeproxy_sync_partial_proxy_rules_duration_seconds", typ: "histogram", labels: []string{"ip_family"}, buckets: syncBounds, kubeProxy: "iptables, nftables", served: []string{"iptables", "nftables", "ebpf"},
		event: "a partial sync", test: "TestProxierWithFakes"},
	{name: "kubeproxy_sync_proxy_rules_last_timestamp_seconds", typ: "gauge", labels: []string{"ip_family"}, kubeProxy: "all", served: allModes},
	{name: "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", typ: "gauge", labels: []string{"ip_family"}, kubeProxy: "all", served: allModes},
	{name: "kubeproxy_network_programming_duration_seconds", typ: "histogram", labels: []string{"ip_family"}, buckets: programBounds, kubeProxy: "all", served: allModes,
		event: "a sync of an EndpointSlice change with a last-change-trigger-time", test: "TestProxierWithFakes"},
	{name: "kubeproxy_sync_proxy_rules_endpoint_changes_pending", typ: "gauge", kubeProxy: "all", served: allModes},
	{name: "kubeproxy_sync_proxy_rules_endpoint_changes_total", typ: "counter", kubeProxy: "all", served: allModes},
	{name: "kubeproxy_sync_proxy_rules_service_changes_pending", typ: "gauge", kubeProxy: "all", served: allModes},
	{name: "kubeproxy_sync_proxy_rules_service_changes_total", typ: "counter", kubeProxy: "all", served: allModes},
	{name: "kubeproxy_sync_proxy_rules_no_local_endpoints_total", typ: "gauge", labels: []string{"ip_family", "traffic_policy"}, kubeProxy: "all", served: allModes},
	{name: "kubeproxy_proxy_healthz_total", typ: "counter", labels: []string{"code"}, kubeProxy: "all", served: allModes},
	{name: "kubeproxy_proxy_livez_total", typ: "counter", labels: []string{"code"}, kubeProxy: "all", served: allModes},
	{name: "kubeproxy_conntrack_reconciler_sync_duration_seconds", typ: "histogram", labels: []string{"ip_family"}, buckets: syncBounds, kubeProxy: "iptables, ipvs, nftables", served: allModes},
	{name: "kubeproxy_conntrack_reconciler_deleted_entries_total", typ: "counter", labels: []string{"ip_family"}, kubeProxy: "iptables, ipvs, nftables", served: allModes},
	{name: "kubeproxy_sync_proxy_rules_iptables_restore_failures_total", typ: "counter", labels: []string{"ip_family"}, kubeProxy: "iptables, ipvs", served: []string{"iptables", "ipvs"},
		event: "a failed iptables-restore", test: "TestProxierWithFakes"},
	{name: "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total", typ: "counter", labels: []string{"ip_family"}, kubeProxy: "iptables", served: []string{"iptables"},
		event: "a failed iptables-restore of a partial sync", test: "TestProxierWithFakes"},
	{name: "kubeproxy_sync_proxy_rules_iptables_total", typ: "gauge", labels: []string{"ip_family", "table"}, kubeProxy: "iptables", served: []string{"iptables"}},
	{name: "kubeproxy_sync_proxy_rules_iptables_last", typ: "gauge", labels: []string{"ip_family", "table"}, kubeProxy: "iptables", served: []string{"iptables"}},
	{name: "kubeproxy_iptables_ct_state_invalid_dropped_packets_total", typ: "counter", kubeProxy: "iptables", served: []string{"iptables"},
		note: "read from the nfacct counter ct_state_invalid_dropped_pkts; left out, as in kube-proxy, when the kernel has no nfacct"},
	{name: "kubeproxy_iptables_localhost_nodeports_accepted_packets_total", typ: "counter", kubeProxy: "iptables", served: []string{"iptables"},
		note: "read from the nfacct counter localhost_nps_accepted_pkts; left out, as in kube-proxy, when the kernel has no nfacct"},
	{name: "kubeproxy_sync_proxy_rules_nftables_sync_failures_total", typ: "counter", labels: []string{"ip_family"}, kubeProxy: "nftables", served: []string{"nftables", "ebpf"},
		event: "a failed nftables transaction", test: "TestNFTablesModeWithFakes", note: notEBPFNFT},
	{name: "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total", typ: "counter", labels: []string{"ip_family"}, kubeProxy: "nftables", served: []string{"nftables", "ebpf"},
		event: "a failed clean-up of stale chains", test: "TestSyncAppliesAndRecovers", note: notEBPFNFT},
	{name: "kubeproxy_nftables_localhost_nodeport_listeners", typ: "gauge", labels: []string{"ip_family"}, kubeProxy: "nftables (alpha gate)", note: notNFTLocal},
	{name: "kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total", typ: "counter", labels: []string{"ip_family"}, kubeProxy: "nftables (alpha gate)", note: notNFTLocal},
	{name: "kubeproxy_nftables_localhost_nodeport_rejected_packets_total", typ: "counter", labels: []string{"ip_family", "protocol"}, kubeProxy: "nftables (alpha gate)", note: notNFTLocal},
	{name: "kubeproxy_sync_proxy_rules_winkernel_lb_create_failures_total", typ: "counter", labels: []string{"error", "ip_family", "lb_type"}, kubeProxy: "kernelspace", note: notWindows},
	{name: "kubeproxy_sync_proxy_rules_winkernel_lb_update_failures_total", typ: "counter", labels: []string{"error", "ip_family", "lb_type"}, kubeProxy: "kernelspace", note: notWindows},
	{name: "kubeproxy_sync_proxy_rules_winkernel_lb_delete_failures_total", typ: "counter", labels: []string{"error", "ip_family", "lb_type"}, kubeProxy: "kernelspace", note: notWindows},

	{name: "rest_client_requests_total", typ: "counter", labels: []string{"code", "host", "method"}, kubeProxy: "all", served: allModes, event: onRequest, test: "TestAPIServerServices"},
	{name: "rest_client_request_duration_seconds", typ: "histogram", labels: []string{"host", "verb"}, buckets: restBounds, kubeProxy: "all", served: allModes, event: onDo, test: requestTest},
	{name: "rest_client_rate_limiter_duration_seconds", typ: "histogram", labels: []string{"host", "verb"}, buckets: restBounds, kubeProxy: "all", served: allModes, event: onDo, test: requestTest},
	{name: "rest_client_request_size_bytes", typ: "histogram", labels: []string{"host", "verb"}, buckets: sizeBounds, kubeProxy: "all", served: allModes, event: "a request with a body", test: requestTest},
	{name: "rest_client_response_size_bytes", typ: "histogram", labels: []string{"host", "verb"}, buckets: sizeBounds, kubeProxy: "all", served: allModes, event: onDo, test: requestTest},
	{name: "rest_client_request_retries_total", typ: "counter", labels: []string{"code", "host", "verb"}, kubeProxy: "all", served: allModes, event: "a retried request", test: requestTest},
	{name: "rest_client_exec_plugin_ttl_seconds", typ: "gauge", kubeProxy: "all", served: allModes},
	{name: "rest_client_exec_plugin_certificate_rotation_age", typ: "histogram", buckets: rotateBounds, kubeProxy: "all", served: allModes},
	{name: "rest_client_exec_plugin_call_total", typ: "counter", labels: []string{"call_status", "code"}, kubeProxy: "all", served: allModes, event: "a credential exec plugin call", test: requestTest},
	{name: "rest_client_transport_cache_entries", typ: "gauge", kubeProxy: "all", served: allModes},
	{name: "rest_client_transport_create_calls_total", typ: "counter", labels: []string{"result"}, kubeProxy: "all", served: allModes, event: "building an API server client", test: "TestAPIServerServices"},
	{name: "rest_client_transport_ca_reload_total", typ: "counter", labels: []string{"reason", "result"}, kubeProxy: "all", served: allModes, event: "a CA bundle reload", test: requestTest},
	{name: "rest_client_transport_cert_rotation_gc_calls_total", typ: "counter", kubeProxy: "all", served: allModes},
	{name: "rest_client_transport_cache_gc_calls_total", typ: "counter", labels: []string{"result"}, kubeProxy: "all", served: allModes, event: "a transport cache clean-up", test: requestTest},

	{name: "go_*", kubeProxy: "all", served: allModes, note: "the Go runtime's, all of runtime/metrics as kube-proxy's; the set follows the Go release each is built with"},
	{name: "process_*", kubeProxy: "all", served: allModes},
	{name: "registered_metrics_total", typ: "counter", labels: []string{"deprecated_version", "stability_level"}, kubeProxy: "all", note: notMeta},
	{name: "disabled_metrics_total", typ: "counter", kubeProxy: "all", note: notMeta},
	{name: "hidden_metrics_total", typ: "counter", kubeProxy: "all", note: notMeta},
	{name: "kubernetes_build_info", typ: "gauge", labels: []string{"build_date", "compiler", "git_commit", "git_tree_state", "git_version", "go_version", "major", "minor", "platform"}, kubeProxy: "all",
		note: "describes a Kubernetes release build; proxykit is not one"},
	{name: "kubernetes_feature_enabled", typ: "gauge", labels: []string{"name", "stage"}, kubeProxy: "all", note: "proxykit has no feature gates"},

	{name: "kubeproxy_sync_proxy_rules_iptables_drift_repairs_total", typ: "counter", labels: []string{"ip_family"}, kubeProxy: "none", served: []string{"iptables"},
		event: "a drift check that found the rules changed", test: "TestIPTablesBackendDriftCheck", note: "proxykit's own"},
	{name: "kubeproxy_sync_proxy_rules_ebpf_sync_failures_total", typ: "counter", labels: []string{"ip_family"}, kubeProxy: "none", served: []string{"ebpf"},
		event: "a failed write of the socket load balancer's maps", test: "ebpf.TestModeSyncFailure", note: "proxykit's own"},
	{name: "kubeproxy_sync_proxy_rules_ebpf_drifted_elements_total", typ: "counter", labels: []string{"ip_family"}, kubeProxy: "none", served: []string{"ebpf"},
		event: "a full sync that found the maps changed by another program", test: "ebpf.TestModeDriftCheck", note: "proxykit's own"},
}

// metricTableMarkdown renders metricTable as the README shows it.
func metricTableMarkdown() string {
	var b strings.Builder
	b.WriteString("| family | type | labels | buckets | kube-proxy | proxykit |\n|---|---|---|---|---|---|\n")
	for _, r := range metricTable {
		buckets := ""
		if len(r.buckets) > 0 {
			var s []string
			for _, v := range r.buckets {
				s = append(s, strconv.FormatFloat(v, 'g', -1, 64))
			}
			buckets = strings.Join(s, ", ")
		}
		ours := "not served"
		if len(r.served) > 0 {
			ours = "served: " + strings.Join(r.served, ", ")
			if slices.Equal(r.served, allModes) {
				ours = "served: all"
			}
			if r.event != "" {
				ours += "; from " + r.event
			}
		}
		if r.note != "" {
			ours += "; " + r.note
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", r.name, r.typ, strings.Join(r.labels, ", "), buckets, r.kubeProxy, ours)
	}
	return b.String()
}

// TestMetricTableInREADME checks that the README's metric table is the
// one metricTable gives.
func TestMetricTableInREADME(t *testing.T) {
	checkREADMETable(t, "metric table", metricTableMarkdown())
}

// checkREADMETable checks that the README's text between the comments
// "<!-- name: begin -->" and "<!-- name: end -->" is want.
func checkREADMETable(t *testing.T, name, want string) {
	t.Helper()
	data, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	begin, end := "<!-- "+name+": begin -->\n", "<!-- "+name+": end -->"
	_, rest, ok := strings.Cut(string(data), begin)
	table, _, ok2 := strings.Cut(rest, end)
	if !ok || !ok2 {
		t.Fatalf("README.md has no %q ... %q section", begin, end)
	}
	if diff := cmp.Diff(want, table); diff != "" {
		t.Errorf("README.md's %s (-want +got):\n%s", name, diff)
	}
}

// TestMetricTableTests checks that every test a row names exists.
func TestMetricTableTests(t *testing.T) {
	for _, r := range metricTable {
		if r.event != "" && r.test == "" {
			t.Errorf("%s: served from %q, but no test named", r.name, r.event)
		}
		if r.test == "" {
			continue
		}
		pkg, name, ok := strings.Cut(r.test, ".")
		dirs := []string{".", "../../iptables", "../../nftables"}
		if ok {
			dirs = []string{"../../" + pkg}
		} else {
			name = pkg
		}
		found := false
		for _, dir := range dirs {
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range entries {
				if !strings.HasSuffix(e.Name(), "_test.go") {
					continue
				}
				src, err := os.ReadFile(dir + "/" + e.Name())
				if err != nil {
					t.Fatal(err)
				}
				found = found || strings.Contains(string(src), "\nfunc "+name+"(t *testing.T)")
			}
		}
		if !found {
			t.Errorf("%s: test %s not found", r.name, r.test)
		}
	}
}

// scrapedFamily is a family as /metrics shows it.
type scrapedFamily struct {
	typ     string
	labels  []string
	buckets []float64
}

// scrapeFamilies reads the families of a /metrics page: their types,
// their label names (a histogram's le left out) and the bucket bounds of
// a histogram's first series.
func scrapeFamilies(t *testing.T, url string) map[string]*scrapedFamily {
	t.Helper()
	code, body, err := httpGet(url)
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, code, err)
	}
	families := map[string]*scrapedFamily{}
	var cur string
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(rest, " ")
			cur = name
			families[name] = &scrapedFamily{typ: typ}
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") || cur == "" {
			continue
		}
		f := families[cur]
		sample, labels, _ := strings.Cut(strings.TrimSuffix(line[:strings.LastIndexByte(line, ' ')], "}"), "{")
		var names []string
		le := ""
		for _, kv := range splitLabels(labels) {
			k, v, _ := strings.Cut(kv, "=")
			if k == "le" {
				le = strings.Trim(v, `"`)
				continue
			}
			names = append(names, k)
		}
		slices.Sort(names)
		if f.labels == nil {
			f.labels = names
		}
		if sample == cur+"_bucket" && le != "+Inf" && (len(f.buckets) == 0 || f.buckets[len(f.buckets)-1] < parseFloat(t, le)) {
			f.buckets = append(f.buckets, parseFloat(t, le))
		}
	}
	return families
}

// splitLabels splits `a="x",b="y"` at the commas between pairs.
func splitLabels(s string) []string {
	var out []string
	inQuote, start := false, 0
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\':
			i++
		case s[i] == '"':
			inQuote = !inQuote
		case s[i] == ',' && !inQuote:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

func parseFloat(t *testing.T, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestMetricTableServed runs the proxier in each mode on fakes, scrapes
// /metrics after the first sync and a GET of /healthz and /livez, and
// checks the table against it: a row served in the mode is there with its
// type, labels and kube-proxy's buckets (or names the event that gives it
// its first series), a row not served in the mode is not there, and every
// family there has a row.
func TestMetricTableServed(t *testing.T) {
	for _, mode := range allModes {
		t.Run(mode, func(t *testing.T) {
			node := newFakeNode(t)
			if mode == "ipvs" {
				node.withIPVS(t)
			}
			args := []string{"--proxy-mode", mode}
			if mode == modeEBPF {
				// The fake node's maps: the cgroup is never opened.
				args = append(args, "--ebpf-cgroup-path", "/sys/fs/cgroup/not-used")
			}
			r := startOnFakes(t, node, args...)
			defer r.stop(t)
			eventually(t, 20*time.Second, "the first sync", func() error {
				if r.metric(t, `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`) == 0 {
					return fmt.Errorf("no sync yet")
				}
				return nil
			})
			for _, path := range []string{"/healthz", "/livez"} {
				if _, _, err := httpGet(node.url(t, "127.0.0.1:10256", path)); err != nil {
					t.Fatal(err)
				}
			}
			got := scrapeFamilies(t, r.metricsURL)
			seen := map[string]bool{}
			for _, row := range metricTable {
				servedHere := slices.Contains(row.served, mode)
				if prefix, ok := strings.CutSuffix(row.name, "*"); ok {
					n := 0
					for name := range got {
						if strings.HasPrefix(name, prefix) {
							seen[name] = true
							n++
						}
					}
					if servedHere != (n > 0) {
						t.Errorf("%s: %d families on /metrics, served here: %v", row.name, n, servedHere)
					}
					continue
				}
				f, ok := got[row.name]
				seen[row.name] = true
				switch {
				case ok && !servedHere:
					t.Errorf("%s is on /metrics, but the table says it is not served in %s mode", row.name, mode)
				case !ok && servedHere && row.event == "":
					t.Errorf("%s is not on /metrics after a sync", row.name)
				case ok:
					want := scrapedFamily{typ: row.typ, labels: row.labels, buckets: row.buckets}
					if diff := cmp.Diff(want, *f, cmp.AllowUnexported(scrapedFamily{}), cmp.Comparer(func(a, b []string) bool { return slices.Equal(a, b) })); diff != "" {
						t.Errorf("%s (-table +/metrics):\n%s", row.name, diff)
					}
				}
			}
			for name := range got {
				if !seen[name] {
					t.Errorf("%s is on /metrics but has no row in the table", name)
				}
			}
		})
	}
}
