package ebpf_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	cebpf "github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/proxy"
)

// clientEnv makes the test binary a client process (see TestMain): its
// value is "OP NETWORK ADDR:PORT COUNT".
const clientEnv = "PROXYKIT_EBPF_CLIENT"

func TestMain(m *testing.M) {
	if spec := os.Getenv(clientEnv); spec != "" {
		os.Exit(runClient(spec))
	}
	os.Exit(m.Run())
}

// runClient connects COUNT times and prints one line per attempt: the
// backend's name and the peer address the socket reports (getpeername
// for "dial", the reply's source, from recvmsg, for "sendto"), or
// "error ERRNO". Specs separated by ";" run in turn, with a line "--"
// between their lines.
func runClient(specs string) int {
	for i, spec := range strings.Split(specs, ";") {
		if i > 0 {
			fmt.Println("--")
		}
		if rc := runSpec(spec); rc != 0 {
			return rc
		}
	}
	return 0
}

func runSpec(spec string) int {
	var op, network, addr string
	var count int
	if _, err := fmt.Sscan(spec, &op, &network, &addr, &count); err != nil {
		fmt.Println("bad spec:", err)
		return 2
	}
	for range count {
		name, peer, err := clientOnce(op, network, addr)
		if err != nil {
			var errno syscall.Errno
			if errors.As(err, &errno) {
				fmt.Println("error", unix.ErrnoName(errno))
			} else {
				fmt.Println("error", err)
			}
			continue
		}
		fmt.Println(name, peer)
	}
	return 0
}

func clientOnce(op, network, addr string) (name, peer string, err error) {
	// Generous: the VM tier emulates its CPU.
	deadline := time.Now().Add(5 * time.Second)
	switch op {
	case "dial":
		conn, err := net.DialTimeout(network, addr, 5*time.Second)
		if err != nil {
			return "", "", err
		}
		defer conn.Close()
		_ = conn.SetDeadline(deadline)
		raw, err := conn.(syscall.Conn).SyscallConn()
		if err != nil {
			return "", "", err
		}
		var sa unix.Sockaddr
		var perr error
		if err := raw.Control(func(fd uintptr) { sa, perr = unix.Getpeername(int(fd)) }); err != nil {
			return "", "", err
		}
		if perr != nil {
			return "", "", perr
		}
		peer = sockaddrString(sa)
		if network == "udp" {
			if _, err := conn.Write([]byte("hello\n")); err != nil {
				return "", "", err
			}
		}
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			return "", "", err
		}
		return strings.Fields(line)[0], peer, nil
	case "dial6":
		// An IPv6 socket to an address Go would dial over IPv4 (an
		// IPv4-mapped one), as dual-stack programs in other languages do.
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM, 0)
		if err != nil {
			return "", "", err
		}
		ap := netip.MustParseAddrPort(addr)
		if err := unix.Connect(fd, &unix.SockaddrInet6{Addr: netip.AddrFrom16(ap.Addr().As16()).As16(), Port: int(ap.Port())}); err != nil {
			unix.Close(fd)
			return "", "", err
		}
		sa, err := unix.Getpeername(fd)
		if err != nil {
			unix.Close(fd)
			return "", "", err
		}
		conn, err := net.FileConn(os.NewFile(uintptr(fd), "client"))
		if err != nil {
			return "", "", err
		}
		defer conn.Close()
		_ = conn.SetDeadline(deadline)
		line, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			return "", "", err
		}
		return strings.Fields(line)[0], sockaddrString(sa), nil
	case "sendto":
		pc, err := net.ListenPacket(network, "")
		if err != nil {
			return "", "", err
		}
		defer pc.Close()
		_ = pc.SetDeadline(deadline)
		dst, err := net.ResolveUDPAddr(network, addr)
		if err != nil {
			return "", "", err
		}
		if _, err := pc.WriteTo([]byte("hello\n"), dst); err != nil {
			return "", "", err
		}
		buf := make([]byte, 512)
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return "", "", err
		}
		ap := from.(*net.UDPAddr).AddrPort()
		return strings.Fields(string(buf[:n]))[0], netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String(), nil
	case "sctp":
		return sctpOnce(addr)
	}
	return "", "", fmt.Errorf("unknown op %q", op)
}

func sockaddrString(sa unix.Sockaddr) string {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port)).String()
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), uint16(sa.Port)).String()
	}
	return fmt.Sprint(sa)
}

// lab is a client namespace with two backends in namespaces of their
// own, a cgroup v2 hierarchy and a bpffs mounted for the test alone, and
// the socket load balancer of one family attached to a cgroup the test
// made.
type lab struct {
	family   v1.IPFamily
	client   *kerneltest.NS
	backends []netip.Addr // of "a" and "b", port 8080
	cgroup   string
	cfg      ebpf.DatapathConfig
	dp       *ebpf.Datapath
	w        *ebpf.Writer
	c        *writertest.Cluster
	svcIP    string
}

func newLab(t *testing.T, family v1.IPFamily) *lab {
	kerneltest.Require(t)
	l := &lab{family: family}
	cgRoot, bpffs := kerneltest.MountCgroupAndBPF(t)
	// The private mount shows the node's one hierarchy, which other test
	// processes on the machine make their cgroups in too: a name of its own.
	var err error
	if l.cgroup, err = os.MkdirTemp(cgRoot, "proxykit-clients-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(l.cgroup) })

	l.client = kerneltest.NewNS(t)
	nets := []string{"10.1.0.%d/24", "10.2.0.%d/24"}
	l.svcIP = "10.96.0.10"
	if family == v1.IPv6Protocol {
		nets = []string{"fd00:1::%d/64", "fd00:2::%d/64"}
		l.svcIP = "fd00:96::10"
	}
	for i, name := range []string{"a", "b"} {
		srv := kerneltest.NewNS(t)
		cp := netip.MustParsePrefix(fmt.Sprintf(nets[i], 1))
		sp := netip.MustParsePrefix(fmt.Sprintf(nets[i], 2))
		kerneltest.Link(t, l.client, srv, cp, sp)
		kerneltest.StartBackend(t, srv, name, 8080)
		l.backends = append(l.backends, sp.Addr())
	}

	l.cfg = ebpf.DatapathConfig{Family: family, CgroupPath: l.cgroup, PinPath: bpffs, NamePrefix: "test"}
	dp, err := ebpf.Open(l.cfg)
	if err != nil {
		t.Fatalf("Open: %+v", err)
	}
	l.dp = dp
	t.Cleanup(func() { dp.Close(); _ = ebpf.Cleanup(l.cfg) })
	l.w, err = ebpf.NewWriter(dp, ebpf.WriterConfig{Family: family, Node: proxy.NodeConfig{Name: writertest.Node}})
	if err != nil {
		t.Fatal(err)
	}
	l.c = writertest.NewCluster(family, writertest.Node)
	return l
}

func (l *lab) endpoint(i int) writertest.Endpoint {
	return writertest.Endpoint{IP: l.backends[i].String(), Node: "node-b"}
}

func (l *lab) sync(t *testing.T) ebpf.SyncResult {
	t.Helper()
	r, err := l.w.Sync(context.Background(), l.c.Input())
	if err != nil {
		t.Fatalf("Sync: %v", err)
	}
	return r
}

// run runs the client process in the lab's cgroup (placed there by
// clone3 before it runs) and namespace, and returns its lines.
func (l *lab) run(t *testing.T, op, network string, port uint16, count int) []string {
	t.Helper()
	return l.runIn(t, l.cgroup, op, network, port, count)
}

// runIn is run in another cgroup.
func (l *lab) runIn(t *testing.T, cgroup, op, network string, port uint16, count int) []string {
	t.Helper()
	return l.runAt(t, cgroup, op, network, netip.AddrPortFrom(netip.MustParseAddr(l.svcIP), port), count)
}

// runAt is runIn to any destination.
func (l *lab) runAt(t *testing.T, cgroup, op, network string, dst netip.AddrPort, count int) []string {
	t.Helper()
	return l.runSpecs(t, cgroup, fmt.Sprintf("%s %s %s %d", op, network, dst, count))
}

// runSpecs runs a client process with specs (see runClient) in cgroup
// and the lab's namespace, and returns its lines.
func (l *lab) runSpecs(t *testing.T, cgroup, specs string) []string {
	t.Helper()
	cg, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	var out []byte
	err = l.client.Do(func() error {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), clientEnv+"="+specs)
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
		var err error
		out, err = cmd.Output()
		return err
	})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func forFamilies(t *testing.T, fn func(t *testing.T, l *lab)) {
	for _, f := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		t.Run(string(f), func(t *testing.T) { fn(t, newLab(t, f)) })
	}
}

// webService programs Service ns/web, TCP port 80 and UDP port 53 to
// port 8080 of the lab's endpoint i, and returns the Service's address
// with a port as a client sees it.
func (l *lab) webService(t *testing.T, i int) func(port uint16) string {
	l.c.SetService(writertest.Service("ns", "web", l.svcIP, writertest.WithPorts(
		v1.ServicePort{Name: "p", Port: 80, Protocol: v1.ProtocolTCP},
		v1.ServicePort{Name: "u", Port: 53, Protocol: v1.ProtocolUDP})))
	l.c.SetEndpoints("ns", "web", []discoveryv1.EndpointPort{writertest.SlicePort("p", 8080, v1.ProtocolTCP), writertest.SlicePort("u", 8080, v1.ProtocolUDP)}, l.endpoint(i))
	l.sync(t)
	return func(port uint16) string { return netip.AddrPortFrom(netip.MustParseAddr(l.svcIP), port).String() }
}

// TestKernelConnect: a TCP connect to a cluster IP reaches an endpoint,
// and getpeername gives the Service address back; a UDP socket that
// connects does the same.
func TestKernelConnect(t *testing.T) {
	forFamilies(t, func(t *testing.T, l *lab) {
		svc := l.webService(t, 0)
		if diff := cmp.Diff(repeat("a "+svc(80), 3), l.run(t, "dial", "tcp", 80, 3)); diff != "" {
			t.Errorf("TCP connect (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff(repeat("a "+svc(53), 3), l.run(t, "dial", "udp", 53, 3)); diff != "" {
			t.Errorf("UDP connect (-want +got):\n%s", diff)
		}
		// A process of a sibling cgroup is not translated: the programs
		// act on the cgroup they are attached to, and the client's
		// namespace has no route to the Service address.
		other, err := os.MkdirTemp(filepath.Dir(l.cgroup), "other-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Remove(other) })
		if diff := cmp.Diff([]string{"error ENETUNREACH"}, l.runIn(t, other, "dial", "tcp", 80, 1)); diff != "" {
			t.Errorf("TCP connect from outside the cgroup (-want +got):\n%s", diff)
		}
	})
}

// TestKernelV4Mapped: an IPv6 socket that connects or sends to the
// IPv4-mapped form of an IPv4 cluster IP is translated by the IPv6
// programs with the IPv4 maps, and gets the Service address back.
func TestKernelV4Mapped(t *testing.T) {
	l := newLab(t, v1.IPv4Protocol)
	l.openIPv6(t)
	svc := l.webService(t, 1)
	if diff := cmp.Diff(repeat("b "+svc(80), 2), l.run(t, "dial6", "tcp", 80, 2)); diff != "" {
		t.Errorf("TCP connect of an IPv6 socket (-want +got):\n%s", diff)
	}
	// Go's "udp" socket is dual-stack: the datagram goes to the mapped address.
	if diff := cmp.Diff(repeat("b "+svc(53), 2), l.run(t, "sendto", "udp", 53, 2)); diff != "" {
		t.Errorf("UDP sendto of a dual-stack socket (-want +got):\n%s", diff)
	}
}

// TestKernelSendmsg: an unconnected UDP socket's datagram to a cluster
// IP reaches an endpoint, and recvmsg gives the reply the Service address
// as its source.
func TestKernelSendmsg(t *testing.T) {
	forFamilies(t, func(t *testing.T, l *lab) {
		l.c.SetService(writertest.Service("ns", "dns", l.svcIP, writertest.WithPorts(v1.ServicePort{Name: "u", Port: 53, Protocol: v1.ProtocolUDP})))
		l.c.SetEndpoints("ns", "dns", []discoveryv1.EndpointPort{writertest.SlicePort("u", 8080, v1.ProtocolUDP)}, l.endpoint(1))
		l.sync(t)
		want := repeat("b "+netip.AddrPortFrom(netip.MustParseAddr(l.svcIP), 53).String(), 3)
		network := "udp4"
		if l.family == v1.IPv6Protocol {
			network = "udp6"
		}
		if diff := cmp.Diff(want, l.run(t, "sendto", network, 53, 3)); diff != "" {
			t.Errorf("UDP sendto/recvfrom (-want +got):\n%s", diff)
		}
	})
}

// TestKernelNoEndpoints: a Service without endpoints refuses connect and
// sendmsg with ECONNREFUSED.
func TestKernelNoEndpoints(t *testing.T) {
	forFamilies(t, func(t *testing.T, l *lab) {
		l.c.SetService(writertest.Service("ns", "web", l.svcIP, writertest.WithPorts(
			v1.ServicePort{Name: "p", Port: 80, Protocol: v1.ProtocolTCP},
			v1.ServicePort{Name: "u", Port: 53, Protocol: v1.ProtocolUDP})))
		l.sync(t)
		if diff := cmp.Diff([]string{"error ECONNREFUSED"}, l.run(t, "dial", "tcp", 80, 1)); diff != "" {
			t.Errorf("TCP connect (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"error ECONNREFUSED"}, l.run(t, "sendto", "udp", 53, 1)); diff != "" {
			t.Errorf("UDP sendto (-want +got):\n%s", diff)
		}
	})
}

// TestKernelAffinityAndChange: with ClientIP affinity every connection
// of the namespace goes to one endpoint; removing that endpoint sends
// them all to the other at once.
func TestKernelAffinityAndChange(t *testing.T) {
	forFamilies(t, func(t *testing.T, l *lab) {
		l.c.SetService(writertest.Service("ns", "web", l.svcIP, writertest.WithAffinity(600)))
		l.c.SetEndpoints("ns", "web", writertest.TCP8080, l.endpoint(0), l.endpoint(1))
		l.sync(t)
		got := l.run(t, "dial", "tcp", 80, 12)
		first := got[0]
		if diff := cmp.Diff(repeat(first, 12), got); diff != "" {
			t.Fatalf("connections under affinity (-want +got):\n%s", diff)
		}
		// Remove the endpoint affinity chose: one endpoint change.
		keep := l.endpoint(1)
		other := "b"
		if strings.HasPrefix(first, "b ") {
			keep, other = l.endpoint(0), "a"
		}
		l.c.SetEndpoints("ns", "web", writertest.TCP8080, keep)
		if r := l.sync(t); r.Full || r.Updates+r.Deletes > 4 {
			t.Errorf("one endpoint change: %+v, want a partial sync of at most 4 element operations", r)
		}
		svc := netip.AddrPortFrom(netip.MustParseAddr(l.svcIP), 80).String()
		if diff := cmp.Diff(repeat(other+" "+svc, 6), l.run(t, "dial", "tcp", 80, 6)); diff != "" {
			t.Errorf("after removing the endpoint (-want +got):\n%s", diff)
		}
	})
}

// TestKernelRandom: without affinity both endpoints are reached (the
// chance that 40 connections all pick one of two is 2^-39).
func TestKernelRandom(t *testing.T) {
	forFamilies(t, func(t *testing.T, l *lab) {
		l.c.SetService(writertest.Service("ns", "web", l.svcIP))
		l.c.SetEndpoints("ns", "web", writertest.TCP8080, l.endpoint(0), l.endpoint(1))
		l.sync(t)
		seen := map[string]bool{}
		for _, line := range l.run(t, "dial", "tcp", 80, 40) {
			seen[strings.Fields(line)[0]] = true
		}
		if diff := cmp.Diff(map[string]bool{"a": true, "b": true}, seen); diff != "" {
			t.Errorf("backends reached (-want +got):\n%s", diff)
		}
	})
}

// TestKernelDriftAndCleanup: an element deleted behind the writer's back
// is found by Drift and put back by the next sync; Cleanup leaves no
// program attached to the cgroup and nothing pinned, and a reopened
// datapath takes over the pinned maps' content.
func TestKernelDriftAndCleanup(t *testing.T) {
	forFamilies(t, func(t *testing.T, l *lab) {
		l.c.SetService(writertest.Service("ns", "web", l.svcIP))
		l.c.SetEndpoints("ns", "web", writertest.TCP8080, l.endpoint(0))
		l.sync(t)
		fr := ebpf.Frontend{Addr: netip.MustParseAddr(l.svcIP), Port: 80, Protocol: v1.ProtocolTCP}
		if err := l.dp.DeleteService(fr); err != nil {
			t.Fatal(err)
		}
		if n, err := l.w.Drift(); err != nil || n != 1 {
			t.Fatalf("Drift() = %d, %v; want 1", n, err)
		}
		if r := l.sync(t); !r.Full || r.Drifted != 1 || r.Updates != 1 {
			t.Errorf("repairing sync: %+v, want full with 1 drifted and 1 update", r)
		}
		svc := netip.AddrPortFrom(netip.MustParseAddr(l.svcIP), 80).String()
		if diff := cmp.Diff([]string{"a " + svc}, l.run(t, "dial", "tcp", 80, 1)); diff != "" {
			t.Errorf("after repair (-want +got):\n%s", diff)
		}

		// A restarted proxy takes the pinned maps over.
		if err := l.dp.Close(); err != nil {
			t.Fatal(err)
		}
		dp, err := ebpf.Open(l.cfg)
		if err != nil {
			t.Fatalf("reopening: %v", err)
		}
		st, err := dp.Dump()
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(l.w.Written(), st, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
			t.Errorf("reopened maps (-written +kernel):\n%s", diff)
		}
		if diff := cmp.Diff(4, attached(t, l.cgroup)); diff != "" {
			t.Errorf("programs attached while open (-want +got):\n%s", diff)
		}
		dp.Close()
		if diff := cmp.Diff(4, attached(t, l.cgroup)); diff != "" {
			t.Errorf("programs attached after Close (-want +got):\n%s", diff)
		}

		if err := ebpf.Cleanup(l.cfg); err != nil {
			t.Fatalf("Cleanup: %v", err)
		}
		if n := attached(t, l.cgroup); n != 0 {
			t.Errorf("%d programs still attached after Cleanup", n)
		}
		if left, err := ebpf.FindLeftovers(l.cfg); err != nil || left {
			t.Errorf("FindLeftovers after Cleanup = %v, %v", left, err)
		}
		entries, err := os.ReadDir(l.cfg.PinPath)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			// maps.debug and progs.debug are the bpffs' own.
			if strings.HasPrefix(e.Name(), l.cfg.NamePrefix) {
				t.Errorf("still pinned after Cleanup: %s", e.Name())
			}
		}
	})
}

// attached counts the programs attached to the cgroup on every hook of
// the socket load balancer.
func attached(t *testing.T, cgroup string) int {
	t.Helper()
	f, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	for _, at := range []cebpf.AttachType{
		cebpf.AttachCGroupInet4Connect, cebpf.AttachCGroupUDP4Sendmsg, cebpf.AttachCGroupUDP4Recvmsg, cebpf.AttachCgroupInet4GetPeername,
		cebpf.AttachCGroupInet6Connect, cebpf.AttachCGroupUDP6Sendmsg, cebpf.AttachCGroupUDP6Recvmsg, cebpf.AttachCgroupInet6GetPeername,
	} {
		r, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: at})
		if err != nil {
			t.Fatalf("querying %s: %v", at, err)
		}
		n += len(r.Programs)
	}
	return n
}
