package ebpf_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/proxy"
)

// TestKernelDualStack: a dual-stack Service, served by one Datapath and
// one Writer per family on one cgroup, PinPath and NamePrefix (the IPv6
// Datapath shares the IPv4 maps for IPv4-mapped addresses). Each
// family's sockets reach that family's endpoints, as the servers see
// them, and getpeername and recvmsg give back that family's cluster IP;
// an IPv6 socket to the IPv4-mapped cluster IP reaches the IPv4 endpoint.
// A change to one family leaves the other alone. Cleanup of the IPv6
// Datapath detaches its programs and leaves the IPv4 one serving, with
// the maps they shared; cleanup of both leaves nothing.
func TestKernelDualStack(t *testing.T) {
	l := newLab(t, v1.IPv4Protocol)
	_, servers := l.addrBackends(t, []string{"10.3.0.0/24", "fd00:3::/64"}, 2, 8080)
	s4, s6 := servers[0], servers[1]

	dp6, cfg6 := l.openIPv6(t)
	w6, err := ebpf.NewWriter(dp6, ebpf.WriterConfig{Family: v1.IPv6Protocol, Node: proxy.NodeConfig{Name: writertest.Node}})
	if err != nil {
		t.Fatal(err)
	}
	c6 := writertest.NewCluster(v1.IPv6Protocol, writertest.Node)
	sync6 := func() ebpf.SyncResult {
		t.Helper()
		r, err := w6.Sync(context.Background(), c6.Input())
		if err != nil {
			t.Fatalf("IPv6 Sync: %v", err)
		}
		return r
	}

	ip4, ip6 := netip.MustParseAddr("10.96.0.30"), netip.MustParseAddr("fd00:96::30")
	svc := writertest.Service("ns", "dual", ip4.String(), writertest.WithPorts(
		v1.ServicePort{Name: "p", Port: 80, Protocol: v1.ProtocolTCP},
		v1.ServicePort{Name: "u", Port: 53, Protocol: v1.ProtocolUDP}))
	svc.Spec.ClusterIPs = []string{ip4.String(), ip6.String()}
	svc.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
	svc.Spec.IPFamilyPolicy = ptr.To(v1.IPFamilyPolicyRequireDualStack)
	ports := []discoveryv1.EndpointPort{writertest.SlicePort("p", 8080, v1.ProtocolTCP), writertest.SlicePort("u", 8080, v1.ProtocolUDP)}
	l.c.SetService(svc)
	c6.SetService(svc)
	l.c.SetEndpoints("ns", "dual", ports, writertest.Endpoint{IP: s4[0].String(), Node: "node-b"})
	c6.SetEndpoints("ns", "dual", ports, writertest.Endpoint{IP: s6[0].String(), Node: "node-b"}, writertest.Endpoint{IP: s6[1].String(), Node: "node-b"})
	l.sync(t)
	sync6()

	tcp4, tcp6 := netip.AddrPortFrom(ip4, 80), netip.AddrPortFrom(ip6, 80)
	udp4, udp6 := netip.AddrPortFrom(ip4, 53), netip.AddrPortFrom(ip6, 53)
	cases := []struct {
		name string
		run  clientRun
		want []string
	}{
		{"TCP to the IPv4 cluster IP", clientRun{"dial", "tcp", tcp4, 5}, []string{reached(s4[0], 8080, tcp4)}},
		// 30 connections miss one of two endpoints with a chance of 2^-29.
		{"TCP to the IPv6 cluster IP", clientRun{"dial", "tcp", tcp6, 30}, []string{reached(s6[0], 8080, tcp6), reached(s6[1], 8080, tcp6)}},
		{"UDP sendto the IPv4 cluster IP", clientRun{"sendto", "udp4", udp4, 3}, []string{reached(s4[0], 8080, udp4)}},
		{"UDP sendto the IPv6 cluster IP", clientRun{"sendto", "udp6", udp6, 30}, []string{reached(s6[0], 8080, udp6), reached(s6[1], 8080, udp6)}},
		{"TCP of an IPv6 socket to the IPv4-mapped cluster IP", clientRun{"dial6", "tcp", tcp4, 3}, []string{reached(s4[0], 8080, tcp4)}},
	}
	var runs []clientRun
	for _, tc := range cases {
		runs = append(runs, tc.run)
	}
	for i, lines := range l.runAll(t, runs) {
		if diff := cmp.Diff(cases[i].want, uniq(lines)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", cases[i].name, diff)
		}
	}

	// The IPv6 endpoints go; the IPv4 one stays.
	c6.SetEndpoints("ns", "dual", ports)
	if r := sync6(); r.Full {
		t.Errorf("IPv6 endpoint change: %+v, want a partial sync", r)
	}
	if diff := cmp.Diff([]string{"error ECONNREFUSED"}, l.runAt(t, l.cgroup, "dial", "tcp", tcp6, 1)); diff != "" {
		t.Errorf("IPv6 without endpoints (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(repeat(reached(s4[0], 8080, tcp4), 2), l.runAt(t, l.cgroup, "dial", "tcp", tcp4, 2)); diff != "" {
		t.Errorf("IPv4 after the IPv6 change (-want +got):\n%s", diff)
	}

	// Cleanup of the IPv6 Datapath alone.
	if err := dp6.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ebpf.Cleanup(cfg6); err != nil {
		t.Fatalf("Cleanup IPv6: %v", err)
	}
	if diff := cmp.Diff(4, attached(t, l.cgroup)); diff != "" {
		t.Errorf("programs attached after the IPv6 Cleanup (-want +got):\n%s", diff)
	}
	left6, err6 := ebpf.FindLeftovers(cfg6)
	left4, err4 := ebpf.FindLeftovers(l.cfg)
	if left6 || err6 != nil || !left4 || err4 != nil {
		t.Errorf("FindLeftovers after the IPv6 Cleanup: IPv6 %v, %v; IPv4 %v, %v; want false, true", left6, err6, left4, err4)
	}
	// The IPv6 programs are gone: the client has no route to the IPv6
	// cluster IP of its own.
	if diff := cmp.Diff([]string{"error ENETUNREACH"}, l.runAt(t, l.cgroup, "dial", "tcp", tcp6, 1)); diff != "" {
		t.Errorf("IPv6 after its Cleanup (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(repeat(reached(s4[0], 8080, tcp4), 2), l.runAt(t, l.cgroup, "dial", "tcp", tcp4, 2)); diff != "" {
		t.Errorf("IPv4 after the IPv6 Cleanup (-want +got):\n%s", diff)
	}
	checkCleanup(t, l.cfg, l.dp)
}
