package conntrack_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2/ktesting"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/conntrack/conntracktest"
)

const (
	client  = "10.0.0.2"
	vip     = "10.96.0.10:53"
	nodeIP  = "10.0.0.1"
	ep1     = "10.0.1.2:5353"
	ep2     = "10.0.2.2:5353"
	extIP   = "192.0.2.10:53"
	lbIP    = "203.0.113.10:53"
	vipDNS2 = "10.96.0.11:53"
)

// dns is a UDP service with a node port, an external IP and a load-balancer
// IP, so that every kind of frontend is exercised.
var dns = svc{
	name: "dns", port: "dns", proto: v1.ProtocolUDP, clusterIP: "10.96.0.10", portNum: 53, nodePort: 30053,
	externalIPs: []string{"192.0.2.10"}, lbIPs: []string{"203.0.113.10"},
}

// other is a second UDP service, whose flows must survive cleanups of dns.
var other = svc{name: "other", port: "dns", proto: v1.ProtocolUDP, clusterIP: "10.96.0.11", portNum: 53}

// web is a TCP service on the same endpoints as dns.
var web = svc{name: "web", port: "http", proto: v1.ProtocolTCP, clusterIP: "10.96.0.20", portNum: 80, nodePort: 30080}

func c(port string) string { return client + ":" + port }

// runCleanup loads flows into a fake, cleans it for family with the cluster
// IPs in deletedIPs and returns what is left, what was deleted and the count
// CleanStaleEntries returned.
func runCleanup(t *testing.T, family v1.IPFamily, flows []conntrack.Flow, svcs changetracker.ServicePortMap, eps changetracker.EndpointsMap, deletedIPs sets.Set[netip.Addr], opts ...conntrack.CleanupOption) (left, deleted []conntrack.Flow, n int) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	fake := conntracktest.NewFake()
	if err := fake.AddFlows(flows...); err != nil {
		t.Fatal(err)
	}
	n, err := conntrack.NewCleaner(fake, opts...).CleanStaleEntries(ctx, family, svcs, eps, deletedIPs)
	if err != nil {
		t.Fatalf("CleanStaleEntries: %v", err)
	}
	if n != len(fake.Deleted) {
		t.Errorf("CleanStaleEntries returned %d, fake deleted %d", n, len(fake.Deleted))
	}
	return fake.Flows(), fake.Deleted, n
}

func TestCleanStaleEntries(t *testing.T) {
	for _, tc := range []struct {
		name        string
		family      v1.IPFamily
		svcs        []svc
		eps         []backends
		opts        []conntrack.CleanupOption
		deletedIPs  sets.Set[netip.Addr]
		flows       []conntrack.Flow
		wantDeleted []conntrack.Flow
	}{{
		name: "endpoint removed: its flows go through every frontend, the others stay",
		svcs: []svc{dns, other},
		eps:  []backends{{dns, []ep{{addr: ep2}}}, {other, []ep{{addr: ep1}}}},
		flows: []conntrack.Flow{
			udp(c("40001"), vip, ep1), udp(c("40002"), vip, ep2),
			udp(c("40003"), nodeIP+":30053", ep1), udp(c("40004"), "127.0.0.1:30053", ep2),
			udp(c("40005"), extIP, ep1), udp(c("40006"), lbIP, ep1), udp(c("40007"), lbIP, ep2),
			udp(c("40008"), vipDNS2, ep1), // other service, ep1 still serves it
		},
		wantDeleted: []conntrack.Flow{
			udp(c("40001"), vip, ep1), udp(c("40003"), nodeIP+":30053", ep1),
			udp(c("40005"), extIP, ep1), udp(c("40006"), lbIP, ep1),
		},
	}, {
		name: "not serving is stale, terminating but serving is not",
		svcs: []svc{dns},
		eps:  []backends{{dns, []ep{{addr: ep1, notServing: true}, {addr: ep2, terminating: true}}}},
		flows: []conntrack.Flow{
			udp(c("40001"), vip, ep1), udp(c("40002"), vip, ep2),
		},
		wantDeleted: []conntrack.Flow{udp(c("40001"), vip, ep1)},
	}, {
		name: "endpoint port changed: flows to the old port are stale",
		svcs: []svc{dns},
		eps:  []backends{{dns, []ep{{addr: "10.0.1.2:5354"}}}},
		flows: []conntrack.Flow{
			udp(c("40001"), vip, ep1), udp(c("40002"), vip, "10.0.1.2:5354"),
		},
		wantDeleted: []conntrack.Flow{udp(c("40001"), vip, ep1)},
	}, {
		name: "the service port matters, not just its IP",
		svcs: []svc{dns, {name: "dns", port: "mdns", proto: v1.ProtocolUDP, clusterIP: "10.96.0.10", portNum: 5353}},
		eps: []backends{
			{dns, []ep{{addr: "10.0.1.2:53"}}},
			{svc{name: "dns", port: "mdns", proto: v1.ProtocolUDP}, []ep{{addr: "10.0.1.2:5353"}}},
		},
		flows: []conntrack.Flow{
			udp(c("40001"), vip, "10.0.1.2:53"), udp(c("40002"), "10.96.0.10:5353", "10.0.1.2:5353"),
			udp(c("40003"), vip, "10.0.1.2:5353"), // crossed: port 53 never pointed there
		},
		wantDeleted: []conntrack.Flow{udp(c("40003"), vip, "10.0.1.2:5353")},
	}, {
		name: "TCP is never touched, UDP to no service is never touched",
		svcs: []svc{dns, web},
		eps:  []backends{{dns, []ep{{addr: ep2}}}, {web, nil}},
		flows: []conntrack.Flow{
			flow(conntrack.ProtocolTCP, c("40001"), "10.96.0.20:80", "10.0.1.2:8080"),
			flow(conntrack.ProtocolTCP, c("40002"), nodeIP+":30080", "10.0.1.2:8080"),
			udp(c("40003"), ep1, ep1),                   // straight to a pod
			udp(c("40004"), "10.96.0.99:53", ep1),       // some other DNAT
			udp(c("40005"), "8.8.8.8:53", "8.8.8.8:53"), // the internet
		},
	}, {
		name: "SCTP is ignored by default",
		svcs: []svc{{name: "sig", port: "s", proto: v1.ProtocolSCTP, clusterIP: "10.96.0.30", portNum: 3868}},
		eps:  []backends{{svc{name: "sig", port: "s", proto: v1.ProtocolSCTP}, nil}},
		flows: []conntrack.Flow{
			flow(conntrack.ProtocolSCTP, c("40001"), "10.96.0.30:3868", "10.0.1.2:3868"),
		},
	}, {
		name: "SCTP cleaned when asked for",
		svcs: []svc{dns, {name: "sig", port: "s", proto: v1.ProtocolSCTP, clusterIP: "10.96.0.30", portNum: 3868}},
		eps:  []backends{{dns, nil}, {svc{name: "sig", port: "s", proto: v1.ProtocolSCTP}, []ep{{addr: "10.0.2.2:3868"}}}},
		opts: []conntrack.CleanupOption{conntrack.WithProtocols(v1.ProtocolUDP, v1.ProtocolSCTP)},
		flows: []conntrack.Flow{
			flow(conntrack.ProtocolSCTP, c("40001"), "10.96.0.30:3868", "10.0.1.2:3868"),
			flow(conntrack.ProtocolSCTP, c("40002"), "10.96.0.30:3868", "10.0.2.2:3868"),
			udp(c("40003"), vip, ep1),
		},
		wantDeleted: []conntrack.Flow{
			flow(conntrack.ProtocolSCTP, c("40001"), "10.96.0.30:3868", "10.0.1.2:3868"),
			udp(c("40003"), vip, ep1),
		},
	}, {
		name: "only SCTP cleaned when only SCTP asked for",
		svcs: []svc{dns, {name: "sig", port: "s", proto: v1.ProtocolSCTP, clusterIP: "10.96.0.30", portNum: 3868}},
		eps:  []backends{{dns, nil}, {svc{name: "sig", port: "s", proto: v1.ProtocolSCTP}, nil}},
		opts: []conntrack.CleanupOption{conntrack.WithProtocols(v1.ProtocolSCTP)},
		flows: []conntrack.Flow{
			flow(conntrack.ProtocolSCTP, c("40001"), "10.96.0.30:3868", "10.0.1.2:3868"),
			udp(c("40003"), vip, ep1),
		},
		wantDeleted: []conntrack.Flow{flow(conntrack.ProtocolSCTP, c("40001"), "10.96.0.30:3868", "10.0.1.2:3868")},
	}, {
		name: "an external IP shared by two services keeps the flows of both",
		svcs: []svc{dns, {name: "dns-b", port: "dns", proto: v1.ProtocolUDP, clusterIP: "10.96.0.12", portNum: 53, externalIPs: []string{"192.0.2.10"}}},
		eps: []backends{
			{dns, []ep{{addr: ep1}}},
			{svc{name: "dns-b", port: "dns", proto: v1.ProtocolUDP}, []ep{{addr: ep2}}},
		},
		flows: []conntrack.Flow{
			udp(c("40001"), extIP, ep1), udp(c("40002"), extIP, ep2), udp(c("40003"), extIP, "10.0.3.2:5353"),
		},
		wantDeleted: []conntrack.Flow{udp(c("40003"), extIP, "10.0.3.2:5353")},
	}, {
		name:       "deleted cluster IPs: flows to a removed service are stale",
		svcs:       []svc{other},
		eps:        []backends{{other, []ep{{addr: ep1}}}},
		deletedIPs: sets.New(netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("10.96.0.11")),
		flows: []conntrack.Flow{
			udp(c("40001"), vip, ep1), udp(c("40002"), "10.96.0.10:99", ep2),
			// 10.96.0.11 is listed but still the cluster IP of "other":
			// its healthy flows stay.
			udp(c("40003"), vipDNS2, ep1),
			flow(conntrack.ProtocolTCP, c("40004"), vip, ep1),
		},
		wantDeleted: []conntrack.Flow{udp(c("40001"), vip, ep1), udp(c("40002"), "10.96.0.10:99", ep2)},
	}, {
		name:   "IPv6: only that family's flows are looked at",
		family: v1.IPv6Protocol,
		svcs:   []svc{{name: "dns6", port: "dns", proto: v1.ProtocolUDP, clusterIP: "fd00:96::10", portNum: 53, nodePort: 30053}},
		eps:    []backends{{svc{name: "dns6", port: "dns", proto: v1.ProtocolUDP}, []ep{{addr: "[fd00:2::2]:5353"}}}},
		flows: []conntrack.Flow{
			udp("[fd00::2]:40001", "[fd00:96::10]:53", "[fd00:1::2]:5353"),
			udp("[fd00::2]:40002", "[fd00:96::10]:53", "[fd00:2::2]:5353"),
			udp("[fd00::2]:40003", "[fd00::1]:30053", "[fd00:1::2]:5353"),
			udp(c("40004"), nodeIP+":30053", ep1), // IPv4: not this cleanup's
		},
		wantDeleted: []conntrack.Flow{
			udp("[fd00::2]:40001", "[fd00:96::10]:53", "[fd00:1::2]:5353"),
			udp("[fd00::2]:40003", "[fd00::1]:30053", "[fd00:1::2]:5353"),
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			family := tc.family
			if family == "" {
				family = v1.IPv4Protocol
			}
			_, deleted, n := runCleanup(t, family, tc.flows, servicePortMap(t, family, tc.svcs...), endpointsMap(tc.eps...), tc.deletedIPs, tc.opts...)
			if diff := cmp.Diff(lines(tc.wantDeleted), lines(deleted)); diff != "" {
				t.Errorf("deleted flows (-want +got):\n%s", diff)
			}
			if n != len(tc.wantDeleted) {
				t.Errorf("CleanStaleEntries returned %d, want %d", n, len(tc.wantDeleted))
			}
		})
	}
}

// TestCleanup_Issue48370_ZeroToSomeEndpoints: a client that sent to a UDP
// service while it had no endpoints holds a flow that was never NATed (its
// reply source is the service IP). Reusing its socket after endpoints
// appear, it would keep sending into that flow, past the new DNAT rules,
// until the flow expired; with one-way traffic it never does. The cleanup
// after the sync that adds endpoints must delete it, and only it.
func TestCleanup_Issue48370_ZeroToSomeEndpoints(t *testing.T) {
	blackhole := udp(c("40001"), vip, vip)
	blackholeNodePort := udp(c("40002"), nodeIP+":30053", nodeIP+":30053")
	healthy := udp(c("40003"), vip, ep1) // created after the rules, DNATed
	unrelated := udp(c("40004"), vipDNS2, vipDNS2)

	left, deleted, n := runCleanup(t, v1.IPv4Protocol,
		[]conntrack.Flow{blackhole, blackholeNodePort, healthy, unrelated},
		servicePortMap(t, v1.IPv4Protocol, dns),
		endpointsMap(backends{dns, []ep{{addr: ep1}}}), nil)
	if diff := cmp.Diff(lines([]conntrack.Flow{blackhole, blackholeNodePort}), lines(deleted)); diff != "" || n != 2 {
		t.Errorf("deleted %d flows (-want +got):\n%s", n, diff)
	}
	if diff := cmp.Diff(lines([]conntrack.Flow{healthy, unrelated}), lines(left)); diff != "" {
		t.Errorf("flows left (-want +got):\n%s", diff)
	}
}

// TestCleanup_Issue139628_ScaledToZero: a UDP service scaled to zero keeps
// its flows DNATed to the endpoints that are gone; one-way senders refresh
// them forever and the REJECT rule for a service without endpoints never
// sees their packets. A service with no endpoints must not be skipped:
// all its flows are stale.
func TestCleanup_Issue139628_ScaledToZero(t *testing.T) {
	toEp1 := udp(c("40001"), vip, ep1)
	toEp2ViaNodePort := udp(c("40002"), nodeIP+":30053", ep2)
	notNATed := udp(c("40003"), vip, vip)
	otherSvc := udp(c("40004"), vipDNS2, ep1)

	for _, tc := range []struct {
		name string
		eps  changetracker.EndpointsMap
	}{
		{"no entry in the endpoints map", endpointsMap(backends{other, []ep{{addr: ep1}}})},
		{"an empty entry", endpointsMap(backends{dns, nil}, backends{other, []ep{{addr: ep1}}})},
		{"only endpoints that no longer serve", endpointsMap(backends{dns, []ep{{addr: ep1, notServing: true}}}, backends{other, []ep{{addr: ep1}}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			left, deleted, _ := runCleanup(t, v1.IPv4Protocol,
				[]conntrack.Flow{toEp1, toEp2ViaNodePort, notNATed, otherSvc},
				servicePortMap(t, v1.IPv4Protocol, dns, other), tc.eps, nil)
			if diff := cmp.Diff(lines([]conntrack.Flow{toEp1, toEp2ViaNodePort, notNATed}), lines(deleted)); diff != "" {
				t.Errorf("deleted (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(lines([]conntrack.Flow{otherSvc}), lines(left)); diff != "" {
				t.Errorf("left (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCleanup_Issue122740_RestartKeepsHealthyFlows: kube-proxy used to treat
// every UDP service as newly active on its first sync after a restart and
// flush all their flows, moving QUIC and other long UDP sessions to other
// endpoints. The cleanup has no memory of earlier syncs: a fresh start
// with unchanged services and endpoints deletes nothing, however often it
// runs.
func TestCleanup_Issue122740_RestartKeepsHealthyFlows(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	fake := conntracktest.NewFake()
	flows := []conntrack.Flow{
		udp(c("40001"), vip, ep1), udp(c("40002"), vip, ep2),
		udp(c("40003"), nodeIP+":30053", ep1), udp(c("40004"), extIP, ep2), udp(c("40005"), lbIP, ep1),
		udp(c("40006"), vipDNS2, ep2),
	}
	if err := fake.AddFlows(flows...); err != nil {
		t.Fatal(err)
	}
	before := fake.Dump()
	for restart := range 3 {
		// A new proxy process: new maps built from the same API objects.
		svcs := servicePortMap(t, v1.IPv4Protocol, dns, other)
		eps := endpointsMap(backends{dns, []ep{{addr: ep1}, {addr: ep2}}}, backends{other, []ep{{addr: ep2}}})
		n, err := conntrack.NewCleaner(fake).CleanStaleEntries(ctx, v1.IPv4Protocol, svcs, eps, nil)
		if err != nil || n != 0 {
			t.Fatalf("start %d: CleanStaleEntries = %d, %v; want 0, nil", restart, n, err)
		}
	}
	if diff := cmp.Diff(before, fake.Dump()); diff != "" {
		t.Errorf("table changed by cleanups after restarts (-before +after):\n%s", diff)
	}
}

func TestCleanStaleEntriesErrors(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	svcs := servicePortMap(t, v1.IPv4Protocol, dns)
	eps := endpointsMap(backends{dns, nil})
	stale := udp(c("40001"), vip, ep1)

	fake := conntracktest.NewFake()
	_ = fake.AddFlows(stale)
	fake.ListError = errors.New("netlink: no buffer space")
	cleaner := conntrack.NewCleaner(fake)
	if n, err := cleaner.CleanStaleEntries(ctx, v1.IPv4Protocol, svcs, eps, nil); err == nil || n != 0 || fake.DeleteCalls != 0 {
		t.Errorf("list error: n=%d err=%v deleteCalls=%d; want an error and no delete", n, err, fake.DeleteCalls)
	}

	fake.ListError = nil
	fake.DeleteError = errors.New("netlink: permission denied")
	if _, err := cleaner.CleanStaleEntries(ctx, v1.IPv4Protocol, svcs, eps, nil); !errors.Is(err, fake.DeleteError) {
		t.Errorf("delete error: %v, want it wrapped", err)
	}

	if _, err := cleaner.CleanStaleEntries(ctx, "IPv5", svcs, eps, nil); err == nil {
		t.Error("unknown family: no error")
	}
	_, err := conntrack.NewCleaner(fake, conntrack.WithProtocols(v1.ProtocolTCP)).CleanStaleEntries(ctx, v1.IPv4Protocol, svcs, eps, nil)
	if err == nil || !strings.Contains(err.Error(), "UDP and SCTP") {
		t.Errorf("TCP cleanup: %v, want a refusal", err)
	}
	if fake.Dump() == "" {
		t.Error("a failed cleanup deleted flows")
	}
}
