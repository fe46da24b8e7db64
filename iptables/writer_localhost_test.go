package iptables_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/proxy"
)

// TestWriterNodePortAddresses checks which addresses serve node ports, as
// kube-proxy's TestNodePorts cases have it: loopback addresses only with
// localhost node ports, which IPv6 never has, and then with the
// KUBE-FIREWALL rule that keeps other hosts off 127.0.0.0/8.
func TestWriterNodePortAddresses(t *testing.T) {
	const (
		nodePorts = `-m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" `
		firewall  = `! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`
	)
	for _, tc := range []struct {
		name      string
		family    v1.IPFamily
		localhost bool
		addresses []string
		// want are the rules of KUBE-SERVICES after the service's own.
		want         []string
		wantLocalnet bool
		wantFirewall bool
	}{
		{name: "ipv4, localhost-nodeports enabled", family: v1.IPv4Protocol, localhost: true,
			want: []string{nodePorts + "-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"}, wantLocalnet: true, wantFirewall: true},
		{name: "ipv4, localhost-nodeports disabled", family: v1.IPv4Protocol,
			want: []string{"! -d 127.0.0.0/8 " + nodePorts + "-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"}},
		{name: "ipv4, localhost-nodeports disabled, localhost in nodeport-addresses", family: v1.IPv4Protocol,
			addresses: []string{"192.168.0.0/24", "127.0.0.1/32"},
			want:      []string{"-d 192.168.0.0/24 " + nodePorts + "-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"}},
		{name: "ipv4, localhost-nodeports enabled, localhost in nodeport-addresses", family: v1.IPv4Protocol, localhost: true,
			addresses: []string{"192.168.0.0/24", "127.0.0.1/32"},
			want: []string{
				"-d 192.168.0.0/24 " + nodePorts + "-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS",
				"-d 127.0.0.1/32 " + nodePorts + "-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS",
			}, wantLocalnet: true, wantFirewall: true},
		{name: "ipv4, localhost-nodeports enabled, no localhost in nodeport-addresses", family: v1.IPv4Protocol, localhost: true,
			addresses: []string{"192.168.0.0/24"},
			want:      []string{"-d 192.168.0.0/24 " + nodePorts + "-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"}, wantFirewall: true},
		{name: "ipv4, localhost-nodeports disabled, a prefix holding the loopback range", family: v1.IPv4Protocol,
			addresses: []string{"0.0.0.0/1"},
			want: []string{
				"-d 127.0.0.0/8 -j RETURN",
				"-d 0.0.0.0/1 " + nodePorts + "-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS",
			}},
		{name: "ipv6, localhost-nodeports enabled", family: v1.IPv6Protocol, localhost: true,
			want: []string{"! -d ::1/128 " + nodePorts + "-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"}},
		{name: "ipv6, localhost-nodeports enabled, localhost in nodeport-addresses", family: v1.IPv6Protocol, localhost: true,
			addresses: []string{"2001:db8::/64", "::1/128"},
			want:      []string{"-d 2001:db8::/64 " + nodePorts + "-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, f, clusterIP, epIP := familyCluster(tc.family)
			c.setService(makeService("ns", "np", clusterIP, withNodePort(30080)))
			c.setEndpoints("ns", "np", tcp8080, ep{IP: epIP, Node: "node-a"})
			var prefixes []netip.Prefix
			for _, a := range tc.addresses {
				prefixes = append(prefixes, prefix(a))
			}
			w := mustWriter(t, iptables.WriterConfig{Family: tc.family, Node: proxy.NodeConfig{Name: "node-a", NodePortAddresses: prefixes}, LocalhostNodePorts: tc.localhost})
			res := w.Sync(t.Context(), c.input())
			if err := w.EnsureJumpRules(t.Context(), f); err != nil {
				t.Fatal(err)
			}
			if err := f.RestoreAll(t.Context(), res.Payload, iptables.NoFlushTables, iptables.RestoreCounters); err != nil {
				t.Fatalf("restore: %v\n%s", err, res.Payload)
			}
			w.Applied(nil)
			rules := f.Rules(iptables.TableNAT, iptables.KubeServicesChain)
			first := slices.IndexFunc(rules, func(r string) bool { return !strings.Contains(r, "ns/np:p") })
			if diff := cmp.Diff(tc.want, rules[first:]); diff != "" {
				t.Errorf("KUBE-SERVICES after the service's rules (-want +got):\n%s", diff)
			}
			if got := w.RouteLocalnet(); got != tc.wantLocalnet {
				t.Errorf("RouteLocalnet() = %v, want %v", got, tc.wantLocalnet)
			}
			var wantFW []string
			if tc.wantFirewall {
				wantFW = []string{firewall}
			}
			if diff := cmp.Diff(wantFW, f.Rules(iptables.TableFilter, "KUBE-FIREWALL")); diff != "" {
				t.Errorf("KUBE-FIREWALL (-want +got):\n%s", diff)
			}
			for _, c := range []iptables.Chain{iptables.ChainInput, iptables.ChainOutput} {
				jumps := slices.Contains(f.Rules(iptables.TableFilter, c), "-j KUBE-FIREWALL")
				if jumps != tc.wantFirewall {
					t.Errorf("%s jumps to KUBE-FIREWALL: %v, want %v", c, jumps, tc.wantFirewall)
				}
			}
		})
	}
}

// TestWriterNodePortGuardFollowsPrefix checks that the rule keeping the
// loopback range out of a wider node-port prefix goes to the writer's own
// services chain: in another's, it would fail the restore or change
// that proxy's rules.
func TestWriterNodePortGuardFollowsPrefix(t *testing.T) {
	c, f, clusterIP, epIP := familyCluster(v1.IPv4Protocol)
	c.setService(makeService("ns", "np", clusterIP, withNodePort(30080)))
	c.setEndpoints("ns", "np", tcp8080, ep{IP: epIP, Node: "node-a"})
	w := mustWriter(t, iptables.WriterConfig{
		Family:      v1.IPv4Protocol,
		Node:        proxy.NodeConfig{Name: "node-a", NodePortAddresses: []netip.Prefix{prefix("0.0.0.0/1")}},
		ChainPrefix: "PXYB",
	})
	res := w.Sync(t.Context(), c.input())
	if err := f.RestoreAll(t.Context(), res.Payload, iptables.NoFlushTables, iptables.RestoreCounters); err != nil {
		t.Fatalf("restore: %v\n%s", err, res.Payload)
	}
	if strings.Contains(string(res.Payload), "KUBE-") {
		t.Errorf("the payload of a PXYB writer names KUBE-:\n%s", res.Payload)
	}
	if !slices.Contains(f.Rules(iptables.TableNAT, "PXYB-SERVICES"), "-d 127.0.0.0/8 -j RETURN") {
		t.Errorf("PXYB-SERVICES lacks the loopback guard:\n%s", f.Dump())
	}
}

// familyCluster returns an empty cluster of family on node-a, a fake of
// that family, and a cluster IP and an endpoint address of it.
func familyCluster(family v1.IPFamily) (c *cluster, f *iptablestest.Fake, clusterIP, epIP string) {
	if family == v1.IPv6Protocol {
		return newCluster(family, "node-a"), iptablestest.NewIPv6Fake(), "fd00:96::1", "fd00:1::1"
	}
	return newCluster(family, "node-a"), iptablestest.NewFake(), "10.96.0.1", "10.1.0.1"
}
