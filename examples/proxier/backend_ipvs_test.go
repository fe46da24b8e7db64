package main

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/conntrack/conntracktest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/kernel"
)

// TestIPVSModeWithFakes runs the whole composition in IPVS mode against the
// fakes of IPVS, the dummy interface, ipsets, iptables and conntrack, on
// the demo cluster in a manifest directory the test edits: the first sync
// programs all of it and sets IPVS mode's sysctls; an edit reaches the
// virtual servers, conntrack and the health-check node port; node ports
// follow a new node address; a failed restore is counted and the next
// sync recovers; cancelling leaves everything in place.
func TestIPVSModeWithFakes(t *testing.T) {
	node := newFakeNode(t).withIPVS(t)
	stale := conntracktest.NewFlow(conntrack.ProtocolUDP, netip.MustParseAddrPort("10.244.1.20:40000"),
		netip.MustParseAddrPort("10.96.0.53:53"), netip.MustParseAddrPort("10.244.2.53:53"))
	if err := node.ct.AddFlows(stale); err != nil {
		t.Fatal(err)
	}
	r := startOnFakes(t, node, "--mode", "ipvs")
	ctx := context.Background()
	hcURL := node.url(t, ":32000", "/")
	metric := func(name string) float64 { t.Helper(); return r.metric(t, name) }
	const (
		full     = `kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"}`
		failures = `kubeproxy_sync_proxy_rules_iptables_restore_failures_total{ip_family="IPv4"}`
	)
	web := "TCP 10.96.0.10:80 rr\n  -> 10.244.1.10:8080 weight 1\n  -> 10.244.1.11:8080 weight 1\n  -> 10.244.2.10:8080 weight 1\n"
	eventually(t, 10*time.Second, "first sync", func() error {
		if !strings.Contains(node.lb.Dump(), web) {
			return fmt.Errorf("virtual servers:\n%s", node.lb.Dump())
		}
		return nil
	})
	bound, err := node.binder.Addresses(ctx, ipvs.DummyDevice)
	if err != nil || !slices.Contains(bound, netip.MustParseAddr("10.96.0.10")) || !slices.Contains(bound, netip.MustParseAddr("198.51.100.7")) {
		t.Errorf("%s holds %v (%v), want the cluster IPs and the load balancer's", ipvs.DummyDevice, bound, err)
	}
	if !strings.Contains(node.sets.Dump(), "add KUBE-CLUSTER-IP 10.96.0.10,tcp:80\n") {
		t.Errorf("ipsets:\n%s", node.sets.Dump())
	}
	if got := node.ipt4.Rules(iptables.TableFilter, iptables.ChainInput); !slices.ContainsFunc(got, func(r string) bool { return strings.HasSuffix(r, "-j KUBE-IPVS-FILTER") }) {
		t.Errorf("filter INPUT holds %q, want the jump to KUBE-IPVS-FILTER", got)
	}
	if node.ipt6.Dump() != "" {
		t.Errorf("the IPv4-only node got IPv6 rules:\n%s", node.ipt6.Dump())
	}
	// IPVS mode's sysctls; conn_reuse_mode is left alone on 6.1.
	for name, want := range map[string]string{
		"net/ipv4/vs/conntrack":                              "1",
		"net/ipv4/vs/expire_nodest_conn":                     "1",
		"net/ipv4/vs/expire_quiescent_template":              "1",
		"net/ipv4/ip_forward":                                "1",
		"net/ipv4/vs/conn_reuse_mode":                        "1",
		"net/netfilter/nf_conntrack_tcp_timeout_established": "86400",
	} {
		if got := readSysctl(t, node.root, name); got != want {
			t.Errorf("sysctl %s = %s, want %s", name, got, want)
		}
	}
	checkHTTP(t, hcURL, 200, `"localEndpoints":1`)

	// The edit: the api Service loses its endpoint on this node, dns its
	// endpoint on node-b.
	edited := strings.Replace(r.demo, "- {addresses: [10.244.1.30], nodeName: node-a, conditions: {ready: true}}\n", "", 1)
	edited = strings.Replace(edited, "- {addresses: [10.244.2.53], nodeName: node-b, conditions: {ready: true}}\n", "", 1)
	r.edit(t, edited)
	eventually(t, 10*time.Second, "the edit's sync", func() error {
		if code, body, err := httpGet(hcURL); err != nil || code != http.StatusServiceUnavailable {
			return fmt.Errorf("health-check node port: %d %s %v", code, body, err)
		}
		if strings.Contains(node.lb.Dump(), "10.244.2.53") {
			return fmt.Errorf("dns's removed endpoint is still a real server:\n%s", node.lb.Dump())
		}
		if flows := node.ct.Flows(); len(flows) != 0 {
			return fmt.Errorf("conntrack still holds %v", flows)
		}
		return nil
	})
	// The api load balancer has no local endpoint now: it falls back to
	// the cluster's, and its health check keeps load balancers away.
	if !strings.Contains(node.lb.Dump(), "TCP 198.51.100.7:443 rr\n  -> 10.244.2.30:8443 weight 1\n") {
		t.Errorf("virtual servers after the edit:\n%s", node.lb.Dump())
	}

	// A new node address serves the node ports from the next sync.
	node.binder.setAddrs(append(node.binder.nodeAddrs(), netip.MustParseAddr("192.168.10.99")))
	eventually(t, 10*time.Second, "node ports on the new address", func() error {
		if !strings.Contains(node.lb.Dump(), "TCP 192.168.10.99:30080 rr") {
			return fmt.Errorf("virtual servers:\n%s", node.lb.Dump())
		}
		return nil
	})

	// A set the rules match on goes missing under iptables-restore: the
	// restore fails and is counted, and a later sync succeeds.
	before := metric(full)
	node.lostSet.Store("KUBE-CLUSTER-IP")
	eventually(t, 10*time.Second, "a failed restore", func() error {
		if got := metric(failures); got < 1 {
			return fmt.Errorf("%v restore failures", got)
		}
		return nil
	})
	node.lostSet.Store("")
	fulls := metric(full)
	eventually(t, 10*time.Second, "recovery", func() error {
		if got := metric(full); got <= fulls {
			return fmt.Errorf("%v full syncs", got)
		}
		return nil
	})
	if got := metric(full); got <= before {
		t.Errorf("%v full syncs, had %v before", got, before)
	}
	if got := metric(`kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"}`); got != 0 {
		t.Errorf("%v partial syncs, want none: IPVS mode always syncs in full", got)
	}

	// Stopping leaves everything and releases the netlink sockets.
	rules, servers, sets := node.ipt4.Dump(), node.lb.Dump(), node.sets.Dump()
	r.stop(t)
	if diff := cmp.Diff(rules, node.ipt4.Dump()); diff != "" {
		t.Errorf("stopping changed the rules (-before +after):\n%s", diff)
	}
	if servers != node.lb.Dump() || sets != node.sets.Dump() {
		t.Error("stopping changed the virtual servers or the sets")
	}
	if n := node.ipvsOpen.Load(); n != 0 {
		t.Errorf("%d IPVS nodes left open", n)
	}
	if _, _, err := httpGet(hcURL); err == nil {
		t.Error("the health-check node port still answers after the proxier stopped")
	}
}

// TestTuneIPVS: IPVS mode's sysctls, with conn_reuse_mode set to 0 only on
// kernels from 4.1 to before 5.9, and an error when IPVS's are missing.
func TestTuneIPVS(t *testing.T) {
	for _, tc := range []struct {
		release   string
		connReuse string
	}{{"4.0.9", "1"}, {"4.1.0", "0"}, {"5.8.18", "0"}, {"5.9.0", "1"}, {"6.1.0-56-cloud-amd64", "1"}} {
		t.Run(tc.release, func(t *testing.T) {
			node := newFakeNode(t)
			if err := os.WriteFile(filepath.Join(node.root, "proc/sys/kernel/osrelease"), []byte(tc.release+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := ipvsmode.TuneKernel(context.Background(), &kernel.Kernel{Root: node.root}); err != nil {
				t.Fatal(err)
			}
			for name, want := range map[string]string{
				"net/ipv4/vs/conntrack":       "1",
				"net/ipv4/ip_forward":         "1",
				"net/ipv4/vs/conn_reuse_mode": tc.connReuse,
			} {
				if got := readSysctl(t, node.root, name); got != want {
					t.Errorf("sysctl %s = %s, want %s", name, got, want)
				}
			}
		})
	}
	node := newFakeNode(t)
	if err := os.RemoveAll(filepath.Join(node.root, "proc/sys/net/ipv4/vs")); err != nil {
		t.Fatal(err)
	}
	if err := ipvsmode.TuneKernel(context.Background(), &kernel.Kernel{Root: node.root}); err == nil || !strings.Contains(err.Error(), "net/ipv4/vs/conntrack") {
		t.Errorf("without ip_vs's sysctls: %v, want an error naming vs/conntrack", err)
	}
}
