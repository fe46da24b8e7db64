package ebpf_test

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
)

// addrBackends links a new namespace to the lab's client, on each of
// networks ("10.3.0.0/24", "fd00:3::/64"): the client gets the network's
// first address and the new namespace the next n. On each of those n
// addresses and each of ports a TCP and a UDP server answer with one line,
// "ADDR:PORT CLIENT", the address and port the connection reached as the
// server sees them, so that a test knows which endpoint a socket was
// sent to whichever way it got there. It returns the client's address
// and the n server addresses of each network, in the order of networks.
func (l *lab) addrBackends(t *testing.T, networks []string, n int, ports ...uint16) (client []netip.Addr, servers [][]netip.Addr) {
	t.Helper()
	srv := kerneltest.NewNS(t)
	var veth kerneltest.Veth
	for i, s := range networks {
		p := netip.MustParsePrefix(s).Masked()
		first := p.Addr().Next()
		client = append(client, first)
		addrs := []netip.Addr{}
		for a := first.Next(); len(addrs) < n; a = a.Next() {
			addrs = append(addrs, a)
		}
		servers = append(servers, addrs)
		if i == 0 {
			veth = kerneltest.Link(t, l.client, srv, netip.PrefixFrom(first, p.Bits()), netip.PrefixFrom(addrs[0], p.Bits()))
		} else {
			l.client.AddAddr(t, veth.A, netip.PrefixFrom(first, p.Bits()))
			srv.AddAddr(t, veth.B, netip.PrefixFrom(addrs[0], p.Bits()))
		}
		for _, a := range addrs[1:] {
			srv.AddAddr(t, veth.B, netip.PrefixFrom(a, p.Bits()))
		}
	}
	for _, addrs := range servers {
		serveAddrs(t, srv, addrs, ports...)
	}
	return client, servers
}

// serveAddrs starts, in ns, a TCP and a UDP server on each of addrs and
// each of ports, which answer as addrBackends says.
func serveAddrs(t *testing.T, ns *kerneltest.NS, addrs []netip.Addr, ports ...uint16) {
	t.Helper()
	var wg sync.WaitGroup
	var closers []func() error
	t.Cleanup(func() {
		for _, c := range closers {
			_ = c()
		}
		wg.Wait()
	})
	for _, a := range addrs {
		for _, port := range ports {
			ap := netip.AddrPortFrom(a, port).String()
			var ln net.Listener
			var pc net.PacketConn
			err := ns.Do(func() error {
				var err error
				if ln, err = net.Listen("tcp", ap); err != nil {
					return err
				}
				pc, err = net.ListenPacket("udp", ap)
				return err
			})
			if err != nil {
				t.Fatalf("server on %s: %v", ap, err)
			}
			closers = append(closers, ln.Close, pc.Close)
			wg.Add(2)
			go answerLocalAddr(ln, wg.Done)
			go func() {
				defer wg.Done()
				buf := make([]byte, 512)
				for {
					_, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					_, _ = pc.WriteTo(fmt.Appendf(nil, "%s %s\n", ap, from), from)
				}
			}()
		}
	}
}

// uniq returns the distinct lines, sorted.
func uniq(lines []string) []string {
	out := slices.Clone(lines)
	slices.Sort(out)
	return slices.Compact(out)
}

// reached is the line a client prints for a connection to frontend that
// reached endpoint.
func reached(endpoint netip.Addr, port uint16, frontend netip.AddrPort) string {
	return netip.AddrPortFrom(endpoint, port).String() + " " + frontend.String()
}

// checkCleanup closes dps and runs Cleanup for both families of cfg's
// PinPath and NamePrefix, then fails t if a program of the socket load
// balancer is still attached to cfg.CgroupPath or FindLeftovers finds
// anything pinned.
func checkCleanup(t *testing.T, cfg ebpf.DatapathConfig, dps ...*ebpf.Datapath) {
	t.Helper()
	for _, dp := range dps {
		if err := dp.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	all := cfg
	all.Family = ""
	if err := ebpf.Cleanup(all); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	if diff := cmp.Diff(0, attached(t, cfg.CgroupPath)); diff != "" {
		t.Errorf("programs attached after Cleanup (-want +got):\n%s", diff)
	}
	if left, err := ebpf.FindLeftovers(all); err != nil || left {
		t.Errorf("FindLeftovers after Cleanup = %v, %v; want false, nil", left, err)
	}
}

// clientRun is count attempts of a client's op ("dial", "dial6",
// "sendto", "sctp") over network to dst.
type clientRun struct {
	op, network string
	dst         netip.AddrPort
	count       int
}

// runAll runs runs in one client process of the lab's cgroup (a process
// costs more to start than its connections), and returns the lines of
// each.
func (l *lab) runAll(t *testing.T, runs []clientRun) [][]string {
	t.Helper()
	specs := make([]string, len(runs))
	for i, r := range runs {
		specs[i] = fmt.Sprintf("%s %s %s %d", r.op, r.network, r.dst, r.count)
	}
	out := [][]string{{}}
	for _, line := range l.runSpecs(t, l.cgroup, strings.Join(specs, ";")) {
		if line == "--" {
			out = append(out, []string{})
			continue
		}
		out[len(out)-1] = append(out[len(out)-1], line)
	}
	if len(out) != len(runs) {
		t.Fatalf("client printed %d runs' lines, want %d: %q", len(out), len(runs), out)
	}
	return out
}

// openIPv6 opens the IPv6 Datapath beside the IPv4 lab's, on its cgroup,
// PinPath and NamePrefix, and closes and cleans it up when t ends.
func (l *lab) openIPv6(t *testing.T) (*ebpf.Datapath, ebpf.DatapathConfig) {
	t.Helper()
	cfg6 := l.cfg
	cfg6.Family = v1.IPv6Protocol
	dp6, err := ebpf.Open(cfg6)
	if err != nil {
		t.Fatalf("Open IPv6: %v", err)
	}
	t.Cleanup(func() { dp6.Close(); _ = ebpf.Cleanup(cfg6) })
	return dp6, cfg6
}

// answerLocalAddr accepts connections on ln until it is closed, answers
// each with one line, "LOCAL REMOTE", the addresses of the connection as
// the server sees them, and closes it; then it calls done.
func answerLocalAddr(ln net.Listener, done func()) {
	defer done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = fmt.Fprintf(c, "%s %s\n", c.LocalAddr(), c.RemoteAddr())
		c.Close()
	}
}

// waitReachable dials each of addrs at port directly (no frontend: the
// programs leave it alone) until every dial is answered, for up to 15
// seconds: on a loaded machine an IPv6 neighbour can take longer to
// resolve than a first connection waits, which then fails with
// EHOSTUNREACH for a reason that has nothing to do with the maps.
func (l *lab) waitReachable(t *testing.T, addrs []netip.Addr, port uint16) {
	t.Helper()
	runs := make([]clientRun, len(addrs))
	for i, a := range addrs {
		runs[i] = clientRun{"dial", "tcp", netip.AddrPortFrom(a, port), 1}
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		var failed []string
		for i, lines := range l.runAll(t, runs) {
			for _, line := range lines {
				if strings.HasPrefix(line, "error") {
					failed = append(failed, runs[i].dst.String()+": "+line)
				}
			}
		}
		if len(failed) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("backends not reachable directly within 15s: %q", failed)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
