package ebpf_test

// Tests that need SCTP, which the machines of the other tiers lack: they
// run in the VM tier (hack/vmtest/run.sh ./ebpf:^TestVM), whose kernel
// loads the sctp module, and elsewhere only where SCTP is already loaded.

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
)

// requireSCTP skips t where the kernel has no SCTP loaded, outside the VM
// tier: a test must not load a module into the machine's kernel, which
// creating an SCTP socket would. In the VM (PROXYKIT_VM=1) SCTP is
// required.
func requireSCTP(t *testing.T) {
	t.Helper()
	kerneltest.Require(t)
	if _, err := os.Stat("/proc/net/sctp"); err != nil && os.Getenv(kerneltest.VMEnv) != "1" {
		t.Skipf("this kernel has no SCTP loaded (%v): runs in the VM tier, hack/vmtest/run.sh ./ebpf:^TestVM", err)
	}
}

// sctpOnce is the client's "sctp" op: an SCTP one-to-one socket connects
// to addr and reads the server's line.
func sctpOnce(addr string) (name, peer string, err error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return "", "", err
	}
	af, sa := sockaddrOf(ap)
	fd, err := unix.Socket(af, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
	if err != nil {
		return "", "", err
	}
	defer unix.Close(fd)
	tv := unix.Timeval{Sec: 5}
	for _, opt := range []int{unix.SO_SNDTIMEO, unix.SO_RCVTIMEO} {
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, opt, &tv); err != nil {
			return "", "", err
		}
	}
	if err := unix.Connect(fd, sa); err != nil {
		return "", "", err
	}
	psa, err := unix.Getpeername(fd)
	if err != nil {
		return "", "", err
	}
	buf := make([]byte, 256)
	n, err := unix.Read(fd, buf)
	if err != nil {
		return "", "", err
	}
	f := strings.Fields(string(buf[:n]))
	if len(f) == 0 {
		return "", "", errors.New("empty reply")
	}
	return f[0], sockaddrString(psa), nil
}

// sockaddrOf returns the address family and socket address of ap.
func sockaddrOf(ap netip.AddrPort) (int, unix.Sockaddr) {
	if ap.Addr().Is4() {
		return unix.AF_INET, &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}
	}
	return unix.AF_INET6, &unix.SockaddrInet6{Addr: ap.Addr().As16(), Port: int(ap.Port())}
}

// listenSCTP listens for SCTP on ap, in ns, and answers every association
// with its local address and port, which is ap, and the client's, then
// closes it.
func listenSCTP(t *testing.T, ns *kerneltest.NS, ap netip.AddrPort) {
	t.Helper()
	var ln net.Listener
	err := ns.Do(func() error {
		af, sa := sockaddrOf(ap)
		fd, err := unix.Socket(af, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, unix.IPPROTO_SCTP)
		if err != nil {
			return err
		}
		if err := unix.Bind(fd, sa); err != nil {
			unix.Close(fd)
			return err
		}
		if err := unix.Listen(fd, 64); err != nil {
			unix.Close(fd)
			return err
		}
		f := os.NewFile(uintptr(fd), "sctp")
		defer f.Close()
		ln, err = net.FileListener(f)
		return err
	})
	if err != nil {
		t.Fatalf("SCTP server in %s: %v", ns.Name, err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go answerLocalAddr(ln, func() { close(done) })
}

// TestVMSCTP: the kernel runs the cgroup connect hooks from the connect
// paths of TCP and UDP, and SCTP's connect does not take them (nor do its
// sendmsg calls take the UDP sendmsg hooks): an SCTP socket that connects
// to a cluster IP is left alone, whatever the maps say, and its packets
// go to the cluster IP, for the packet-level backend beside the socket
// load balancer to serve. A TCP connection to the same Service is
// translated. The endpoint's namespace holds the cluster IP too, with a
// server bound to each address alone, so that the server's view tells
// the two ways apart.
func TestVMSCTP(t *testing.T) {
	requireSCTP(t)
	forFamilies(t, func(t *testing.T, l *lab) {
		network, svcIP := "10.5.0.0/24", netip.MustParseAddr("10.96.0.50")
		if l.family == v1.IPv6Protocol {
			network, svcIP = "fd00:5::/64", netip.MustParseAddr("fd00:96::50")
		}
		srv := kerneltest.NewNS(t)
		p := netip.MustParsePrefix(network)
		clientAddr, endpoint := p.Addr().Next(), p.Addr().Next().Next()
		veth := kerneltest.Link(t, l.client, srv, netip.PrefixFrom(clientAddr, p.Bits()), netip.PrefixFrom(endpoint, p.Bits()))
		srv.AddAddr(t, veth.B, netip.PrefixFrom(svcIP, svcIP.BitLen()))
		l.client.AddRoute(t, netip.PrefixFrom(svcIP, svcIP.BitLen()), endpoint)
		listenSCTP(t, srv, netip.AddrPortFrom(endpoint, 8080))
		listenSCTP(t, srv, netip.AddrPortFrom(svcIP, 8080))
		serveAddrs(t, srv, []netip.Addr{endpoint}, 8080)

		l.c.SetService(writertest.Service("ns", "sig", svcIP.String(), writertest.WithPorts(
			v1.ServicePort{Name: "s", Port: 8080, Protocol: v1.ProtocolSCTP},
			v1.ServicePort{Name: "p", Port: 8080, Protocol: v1.ProtocolTCP})))
		l.c.SetEndpoints("ns", "sig", []discoveryv1.EndpointPort{
			writertest.SlicePort("s", 8080, v1.ProtocolSCTP),
			writertest.SlicePort("p", 8080, v1.ProtocolTCP)}, writertest.Endpoint{IP: endpoint.String(), Node: "node-b"})
		if r := l.sync(t); r.ServicePorts != 2 {
			t.Errorf("SyncResult.ServicePorts = %d, want 2 (TCP and SCTP)", r.ServicePorts)
		}
		fr := netip.AddrPortFrom(svcIP, 8080)
		got := l.runAll(t, []clientRun{{"dial", "tcp", fr, 2}, {"sctp", "sctp", fr, 2}})
		if diff := cmp.Diff([][]string{
			repeat(reached(endpoint, 8080, fr), 2),
			repeat(reached(svcIP, 8080, fr), 2),
		}, got); diff != "" {
			t.Errorf("TCP and SCTP to the cluster IP (-want +got):\n%s", diff)
		}
		checkCleanup(t, l.cfg, l.dp)
	})
}
