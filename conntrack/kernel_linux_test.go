package conntrack_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
)

// The kernel tests' network: a client namespace and two backend namespaces,
// each linked to a node namespace that holds the service rules and the
// conntrack table, as a pod, a node and two pods on other nodes would be.
const (
	kClient   = "10.0.0.2"
	kNode     = "10.0.0.1"
	kB1       = "10.0.1.2"
	kB2       = "10.0.2.2"
	kVIP      = "10.96.0.10"
	kSvcPort  = 53
	kNodePort = 30053
	kEpPort   = 5353
)

// kDNS is the Service the rules implement: UDP 53 on the cluster IP and
// node port 30053, to endpoints on port 5353.
var kDNS = svc{name: "dns", port: "dns", proto: v1.ProtocolUDP, clusterIP: kVIP, portNum: kSvcPort, nodePort: kNodePort}

type testbed struct {
	t                    *testing.T
	client, node, b1, b2 *kerneltest.NS
	ct                   conntrack.Interface
}

func newTestbed(t *testing.T) *testbed {
	t.Helper()
	kerneltest.Require(t, "iptables-restore", "conntrack")
	tb := &testbed{t: t, client: kerneltest.NewNS(t), node: kerneltest.NewNS(t), b1: kerneltest.NewNS(t), b2: kerneltest.NewNS(t)}
	kerneltest.Link(t, tb.client, tb.node, netip.MustParsePrefix(kClient+"/24"), netip.MustParsePrefix(kNode+"/24"))
	kerneltest.Link(t, tb.node, tb.b1, netip.MustParsePrefix("10.0.1.1/24"), netip.MustParsePrefix(kB1+"/24"))
	kerneltest.Link(t, tb.node, tb.b2, netip.MustParsePrefix("10.0.2.1/24"), netip.MustParsePrefix(kB2+"/24"))
	tb.client.AddRoute(t, netip.Prefix{}, netip.MustParseAddr(kNode))
	tb.b1.AddRoute(t, netip.Prefix{}, netip.MustParseAddr("10.0.1.1"))
	tb.b2.AddRoute(t, netip.Prefix{}, netip.MustParseAddr("10.0.2.1"))
	tb.node.Sysctl(t, "net.ipv4.ip_forward", "1")

	// Service IPs are routed on, as a real node's default route would
	// take them (here to b2's namespace, which drops them: it does not
	// forward). A packet that meets no DNAT rule thus leaves the node, so
	// its flow is confirmed and stays in the table, un-NATed: the black
	// hole of kubernetes#48370.
	tb.node.AddRoute(t, netip.MustParsePrefix("10.96.0.0/16"), netip.MustParseAddr(kB2))

	kerneltest.StartBackend(t, tb.b1, "b1", kEpPort)
	kerneltest.StartBackend(t, tb.b2, "b2", kEpPort)
	// Conntrack entries are per namespace: only a netlink socket in the
	// node namespace sees the node's flows.
	tb.ct = conntrack.New(conntrack.WithNetNSPath(nsPath(tb.node)))
	return tb
}

// sync installs the rules a proxier would write for kDNS with endpoints
// (IPs, port kEpPort), with iptables-restore in the node namespace: DNAT
// spreading new flows over the endpoints in turn, or REJECT when there are
// none. A nil endpoints means no service rules at all, as before a proxy's
// first sync. A TCP rule sends TCP to the cluster IP to b1, so that the table
// also holds a TCP flow, which no cleanup may touch.
func (tb *testbed) sync(endpoints []string) {
	tb.t.Helper()
	var b strings.Builder
	b.WriteString("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n")
	if endpoints != nil {
		b.WriteString(":PK-SVC - [0:0]\n")
		fmt.Fprintf(&b, "-A PREROUTING -d %s/32 -p tcp -m tcp --dport %d -j DNAT --to-destination %s:%d\n", kVIP, kSvcPort, kB1, kEpPort)
	}
	if len(endpoints) > 0 {
		fmt.Fprintf(&b, "-A PREROUTING -d %s/32 -p udp -m udp --dport %d -j PK-SVC\n", kVIP, kSvcPort)
		fmt.Fprintf(&b, "-A PREROUTING -d %s/32 -p udp -m udp --dport %d -j PK-SVC\n", kNode, kNodePort)
		for i, ip := range endpoints {
			match := ""
			if left := len(endpoints) - i; left > 1 {
				match = fmt.Sprintf("-m statistic --mode nth --every %d --packet 0 ", left)
			}
			fmt.Fprintf(&b, "-A PK-SVC -p udp -m udp %s-j DNAT --to-destination %s:%d\n", match, ip, kEpPort)
		}
	}
	b.WriteString("COMMIT\n*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n")
	// As on any node running a proxy, something uses connection tracking
	// even before the first sync (kube-proxy drops INVALID packets);
	// otherwise the kernel would not track flows in this namespace yet.
	b.WriteString("-A FORWARD -m conntrack --ctstate INVALID -j DROP\n")
	if endpoints != nil && len(endpoints) == 0 {
		fmt.Fprintf(&b, "-A FORWARD -d %s/32 -p udp -m udp --dport %d -j REJECT\n", kVIP, kSvcPort)
		fmt.Fprintf(&b, "-A INPUT -d %s/32 -p udp -m udp --dport %d -j REJECT\n", kNode, kNodePort)
	}
	b.WriteString("COMMIT\n")
	rules := b.String()
	err := tb.node.Do(func() error {
		cmd := exec.Command("iptables-restore")
		cmd.Stdin = strings.NewReader(rules)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("iptables-restore: %w: %s\n%s", err, out, rules)
		}
		return nil
	})
	if err != nil {
		tb.t.Fatal(err)
	}
}

// udpClient is a client socket in the client namespace, kept open so that
// its packets all belong to one flow, as a long-lived UDP client's do.
type udpClient struct {
	conn *net.UDPConn
	dst  string
}

func (tb *testbed) dial(dst string) *udpClient {
	tb.t.Helper()
	c := &udpClient{dst: dst}
	err := tb.client.Do(func() error {
		var err error
		c.conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.MustParseAddrPort(dst)))
		return err
	})
	if err != nil {
		tb.t.Fatal(err)
	}
	tb.t.Cleanup(func() { c.conn.Close() })
	return c
}

// ask sends one datagram and returns the name of the backend that
// answered, or an error (a timeout when the packet went nowhere, a refusal
// when it was rejected).
func (c *udpClient) ask(timeout time.Duration) (string, error) {
	if err := c.conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	if _, err := c.conn.Write([]byte("hello\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c.conn).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("UDP from %s to %s: %w", c.conn.LocalAddr(), c.dst, err)
	}
	name, _, _ := strings.Cut(line, " ")
	return name, nil
}

func (c *udpClient) mustAsk(t *testing.T) string {
	t.Helper()
	name, err := c.ask(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// flows returns the node's IPv4 flows as netlink lists them, as sorted
// conntrack -L lines.
func (tb *testbed) flows() []string {
	tb.t.Helper()
	_, ctx := ktesting.NewTestContext(tb.t)
	flows, err := tb.ct.ListFlows(ctx, v1.IPv4Protocol)
	if err != nil {
		tb.t.Fatal(err)
	}
	out := lines(flows)
	slices.Sort(out)
	return out
}

// conntrackL returns the node's IPv4 flows as the conntrack binary lists
// them, parsed and rendered as sorted conntrack -L lines without counters.
func (tb *testbed) conntrackL() []string {
	tb.t.Helper()
	out := tb.node.MustExec(tb.t, "conntrack", "-L", "-f", "ipv4")
	var flows []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		f, err := parseConntrackLine(line)
		if err != nil {
			tb.t.Fatalf("conntrack -L line %q: %v", line, err)
		}
		flows = append(flows, f.String())
	}
	slices.Sort(flows)
	return flows
}

// parseConntrackLine parses a line of conntrack -L, such as
// "udp 17 29 src=10.0.0.2 dst=10.96.0.10 sport=40001 dport=53 [UNREPLIED]
// src=10.0.1.2 dst=10.0.0.2 sport=5353 dport=40001 mark=0 use=1".
func parseConntrackLine(line string) (conntrack.Flow, error) {
	fields := strings.Fields(line)
	if len(fields) < 2 {
		return conntrack.Flow{}, errors.New("too short")
	}
	proto, err := strconv.Atoi(fields[1])
	if err != nil {
		return conntrack.Flow{}, err
	}
	f := conntrack.Flow{Protocol: conntrack.Protocol(proto)}
	tuples := []*conntrack.Tuple{&f.Original, &f.Reply}
	n := -1 // index of the tuple being filled; a src= starts the next one
	for _, field := range fields[2:] {
		key, value, ok := strings.Cut(field, "=")
		if !ok {
			continue
		}
		if key == "src" {
			n++
		}
		var err error
		switch {
		case key == "zone":
			var z int
			z, err = strconv.Atoi(value)
			f.Zone = uint16(z)
		case n < 0 || n > 1:
			// Counters, marks and such after the tuples.
		case key == "src":
			tuples[n].Src, err = netip.ParseAddr(value)
		case key == "dst":
			tuples[n].Dst, err = netip.ParseAddr(value)
		case key == "sport" || key == "dport":
			var p int
			p, err = strconv.Atoi(value)
			if key == "sport" {
				tuples[n].SrcPort = uint16(p)
			} else {
				tuples[n].DstPort = uint16(p)
			}
		}
		if err != nil {
			return f, fmt.Errorf("%s: %w", field, err)
		}
	}
	if n != 1 {
		return f, errors.New("want an original and a reply tuple")
	}
	return f, nil
}

// checkTable fails the test unless netlink and the conntrack binary both
// list exactly want.
func (tb *testbed) checkTable(what string, want []string) {
	tb.t.Helper()
	want = slices.Sorted(slices.Values(want))
	if diff := cmp.Diff(want, tb.flows()); diff != "" {
		tb.t.Errorf("%s: flows through netlink (-want +got):\n%s", what, diff)
	}
	if diff := cmp.Diff(want, tb.conntrackL()); diff != "" {
		tb.t.Errorf("%s: flows through conntrack -L (-want +got):\n%s", what, diff)
	}
}

func (tb *testbed) cleanup(endpoints ...string) int {
	tb.t.Helper()
	_, ctx := ktesting.NewTestContext(tb.t)
	var eps []ep
	for _, ip := range endpoints {
		eps = append(eps, ep{addr: ip + ":" + strconv.Itoa(kEpPort)})
	}
	n, err := conntrack.NewCleaner(tb.ct).CleanStaleEntries(ctx, v1.IPv4Protocol,
		servicePortMap(tb.t, v1.IPv4Protocol, kDNS), endpointsMap(backends{kDNS, eps}), nil)
	if err != nil {
		tb.t.Fatal(err)
	}
	return n
}

// serviceFlow is the conntrack -L line of client's flow to frontend,
// DNATed to backend (IP, port kEpPort; frontend itself when not NATed).
func serviceFlow(c *udpClient, backend string) string {
	local := netip.MustParseAddrPort(c.conn.LocalAddr().String())
	be := c.dst
	if backend != "" {
		be = backend + ":" + strconv.Itoa(kEpPort)
	}
	return udp(local.String(), c.dst, be).String()
}

func TestKernel_CleanupDeletesExactlyFlowsToRemovedEndpoint(t *testing.T) {
	tb := newTestbed(t)
	tb.sync([]string{kB1, kB2})

	vipAddr := kVIP + ":" + strconv.Itoa(kSvcPort)
	nodePortAddr := kNode + ":" + strconv.Itoa(kNodePort)
	var clients []*udpClient
	for range 4 {
		clients = append(clients, tb.dial(vipAddr))
	}
	for range 2 {
		clients = append(clients, tb.dial(nodePortAddr))
	}
	backendOf := map[*udpClient]string{}
	var want, wantAfter []string
	for _, c := range clients {
		name := c.mustAsk(t)
		backendOf[c] = map[string]string{"b1": kB1, "b2": kB2}[name]
		want = append(want, serviceFlow(c, backendOf[c]))
		if name == "b2" {
			wantAfter = append(wantAfter, serviceFlow(c, kB2))
		}
	}
	// New flows alternate between the endpoints, through both frontends.
	if got := []string{backendOf[clients[0]], backendOf[clients[1]], backendOf[clients[4]], backendOf[clients[5]]}; !slices.Contains(got[:2], kB1) || !slices.Contains(got[:2], kB2) || !slices.Contains(got[2:], kB1) || !slices.Contains(got[2:], kB2) {
		t.Fatalf("flows did not reach both backends through both frontends: %v", got)
	}

	// Flows no cleanup may touch: UDP straight to b1, and TCP through the
	// service to b1.
	direct := tb.dial(kB1 + ":" + strconv.Itoa(kEpPort))
	if name := direct.mustAsk(t); name != "b1" {
		t.Fatalf("direct UDP reached %s", name)
	}
	want = append(want, serviceFlow(direct, ""))
	wantAfter = append(wantAfter, serviceFlow(direct, ""))
	reply, err := kerneltest.Dial(tb.client, "tcp", netip.MustParseAddrPort(vipAddr), 5*time.Second)
	if err != nil || reply.Name != "b1" {
		t.Fatalf("TCP through the service: %+v, %v", reply, err)
	}
	var tcpFlow string
	for _, f := range tb.flows() {
		if strings.HasPrefix(f, "tcp ") {
			tcpFlow = f
		}
	}
	if !strings.Contains(tcpFlow, "src="+kB1+" ") {
		t.Fatalf("no TCP flow to b1 in %v", tb.flows())
	}
	want = append(want, tcpFlow)
	wantAfter = append(wantAfter, tcpFlow)
	tb.checkTable("before", want)

	// b1 stops being an endpoint; the proxier syncs its rules. Without a
	// cleanup, the clients whose flows went to b1 still reach b1.
	tb.sync([]string{kB2})
	for _, c := range clients {
		if backendOf[c] == kB1 {
			if name := c.mustAsk(t); name != "b1" {
				t.Fatalf("before the cleanup, a flow to b1 went to %s: the test cannot show the cleanup works", name)
			}
		}
	}

	toB1 := 0
	for _, c := range clients {
		if backendOf[c] == kB1 {
			toB1++
		}
	}
	if n := tb.cleanup(kB2); n != toB1 {
		t.Errorf("CleanStaleEntries deleted %d flows, want the %d to b1", n, toB1)
	}
	tb.checkTable("after the cleanup", wantAfter)

	// The same sockets now reach b2, through the current rules.
	for _, c := range clients {
		if name := c.mustAsk(t); name != "b2" {
			t.Errorf("after the cleanup, client %s to %s reached %s, want b2", c.conn.LocalAddr(), c.dst, name)
		}
	}
	if n := tb.cleanup(kB2); n != 0 {
		t.Errorf("a second cleanup deleted %d flows, want 0", n)
	}
}

// TestKernel_Issue48370_ZeroToSomeEndpoints: a client that sent to a UDP
// service before it had endpoints (and rules) holds a flow that was never
// NATed; reusing its socket, it stays black-holed after the rules appear
// until the cleanup deletes that flow.
func TestKernel_Issue48370_ZeroToSomeEndpoints(t *testing.T) {
	tb := newTestbed(t)
	tb.sync(nil)
	c := tb.dial(kVIP + ":" + strconv.Itoa(kSvcPort))
	if name, err := c.ask(500 * time.Millisecond); !kerneltest.IsTimeout(err) {
		t.Fatalf("with no rules: got %q, %v; want no answer", name, err)
	}
	blackhole := serviceFlow(c, "")
	tb.checkTable("no rules", []string{blackhole})

	tb.sync([]string{kB2})
	if name, err := c.ask(500 * time.Millisecond); !kerneltest.IsTimeout(err) {
		t.Fatalf("rules installed, no cleanup: got %q, %v; want the flow still black-holed", name, err)
	}

	if n := tb.cleanup(kB2); n != 1 {
		t.Errorf("CleanStaleEntries deleted %d flows, want 1", n)
	}
	if name := c.mustAsk(t); name != "b2" {
		t.Errorf("after the cleanup: reached %s, want b2", name)
	}
	tb.checkTable("after", []string{serviceFlow(c, kB2)})
}

// TestKernel_Issue139628_ScaledToZero: a one-way UDP sender keeps its flow
// to an endpoint alive after the service loses all endpoints, and the
// REJECT rule never sees its packets, until the cleanup deletes the flow.
func TestKernel_Issue139628_ScaledToZero(t *testing.T) {
	tb := newTestbed(t)
	tb.sync([]string{kB1})
	c := tb.dial(kVIP + ":" + strconv.Itoa(kSvcPort))
	if name := c.mustAsk(t); name != "b1" {
		t.Fatalf("reached %s, want b1", name)
	}

	tb.sync([]string{})
	if name := c.mustAsk(t); name != "b1" {
		t.Fatalf("scaled to zero, no cleanup: reached %s; want the stale flow still to b1", name)
	}

	if n := tb.cleanup(); n != 1 {
		t.Errorf("CleanStaleEntries deleted %d flows, want 1", n)
	}
	tb.checkTable("after", nil)
	if _, err := c.ask(5 * time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("after the cleanup: %v, want the REJECT rule's refusal", err)
	}
}

// TestKernel_Issue122740_RestartKeepsHealthyFlows: a proxy that restarts and
// cleans with unchanged services must not move any UDP flow.
func TestKernel_Issue122740_RestartKeepsHealthyFlows(t *testing.T) {
	tb := newTestbed(t)
	tb.sync([]string{kB1, kB2})
	var clients []*udpClient
	var want []string
	first := map[*udpClient]string{}
	for range 4 {
		c := tb.dial(kVIP + ":" + strconv.Itoa(kSvcPort))
		first[c] = c.mustAsk(t)
		want = append(want, serviceFlow(c, map[string]string{"b1": kB1, "b2": kB2}[first[c]]))
		clients = append(clients, c)
	}
	tb.checkTable("before", want)

	// A new process: a new netlink handle, new maps, the same rules.
	tb.ct = conntrack.New(conntrack.WithNetNSPath(nsPath(tb.node)))
	tb.sync([]string{kB1, kB2})
	if n := tb.cleanup(kB1, kB2); n != 0 {
		t.Errorf("CleanStaleEntries after a restart deleted %d flows, want 0", n)
	}
	tb.checkTable("after", want)
	for _, c := range clients {
		if name := c.mustAsk(t); name != first[c] {
			t.Errorf("client %s moved from %s to %s", c.conn.LocalAddr(), first[c], name)
		}
	}
}

// TestKernel_IPv6FlowsByFamily lists and deletes an IPv6 flow through
// netlink, and checks that the families are kept apart.
func TestKernel_IPv6FlowsByFamily(t *testing.T) {
	kerneltest.Require(t, "ip6tables-restore", "conntrack")
	_, ctx := ktesting.NewTestContext(t)
	node, backendNS := kerneltest.NewNS(t), kerneltest.NewNS(t)
	kerneltest.Link(t, node, backendNS, netip.MustParsePrefix("fd00:1::1/64"), netip.MustParsePrefix("fd00:1::2/64"))
	// Something must use connection tracking for the namespace to track.
	err := node.Do(func() error {
		cmd := exec.Command("ip6tables-restore")
		cmd.Stdin = strings.NewReader("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n-A OUTPUT -m conntrack --ctstate INVALID -j DROP\nCOMMIT\n")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	kerneltest.StartBackend(t, backendNS, "b6", kEpPort)
	if _, err := kerneltest.Dial(node, "udp", netip.MustParseAddrPort("[fd00:1::2]:5353"), 5*time.Second); err != nil {
		t.Fatal(err)
	}

	ct := conntrack.New(conntrack.WithNetNSPath(nsPath(node)))
	v6, err := ct.ListFlows(ctx, v1.IPv6Protocol)
	if err != nil {
		t.Fatal(err)
	}
	var flow conntrack.Flow
	for _, f := range v6 {
		if f.Protocol == conntrack.ProtocolUDP && f.Original.Dst == netip.MustParseAddr("fd00:1::2") {
			flow = f
		}
	}
	if !flow.Original.Src.IsValid() || flow.Reply.SrcPort != kEpPort {
		t.Fatalf("no UDP flow to fd00:1::2 among IPv6 flows %v", lines(v6))
	}
	if v4, err := ct.ListFlows(ctx, v1.IPv4Protocol); err != nil || slices.Contains(lines(v4), flow.String()) {
		t.Errorf("IPv4 listing: %v, %v; must not hold the IPv6 flow", lines(v4), err)
	}
	if n, err := ct.DeleteFlows(ctx, v1.IPv4Protocol, []conntrack.Flow{flow}); err != nil || n != 0 {
		t.Errorf("deleting the IPv6 flow as IPv4: %d, %v; want 0, nil", n, err)
	}
	if n, err := ct.DeleteFlows(ctx, v1.IPv6Protocol, []conntrack.Flow{flow}); err != nil || n != 1 {
		t.Errorf("deleting the IPv6 flow: %d, %v; want 1, nil", n, err)
	}
	if out := node.MustExec(t, "conntrack", "-L", "-f", "ipv6", "-p", "udp"); strings.Contains(out, "fd00:1::2") {
		t.Errorf("conntrack -L still shows the flow:\n%s", out)
	}
	if _, err := ct.ListFlows(ctx, "IPv5"); err == nil {
		t.Error("ListFlows with an unknown family did not fail")
	}
}

// nsPath is where kerneltest bind-mounts ns, as WithNetNSPath takes it.
func nsPath(ns *kerneltest.NS) string { return "/run/netns/" + ns.Name }
