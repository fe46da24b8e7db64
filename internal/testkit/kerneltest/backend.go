package kerneltest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Backend is a TCP and UDP server started by [StartBackend] inside a
// namespace. It answers every TCP connection and every UDP datagram with
// one line, "NAME CLIENT-IP", then (for TCP) closes the connection: the
// client learns which backend it reached and which source address the
// backend saw, which is how tests check load balancing and source-IP
// preservation.
type Backend struct {
	// Name is what the backend answers with.
	Name string
	// Port is the TCP and UDP port it listens on, on every address of its
	// namespace (IPv4 and IPv6).
	Port uint16

	tcp  net.Listener
	udp  net.PacketConn
	wg   sync.WaitGroup
	once sync.Once
}

// StartBackend starts a backend named name on port (TCP and UDP, all
// addresses of ns) and stops it when t ends. It fails t if a socket cannot
// be opened.
func StartBackend(t testing.TB, ns *NS, name string, port uint16) *Backend {
	t.Helper()
	b := &Backend{Name: name, Port: port}
	addr := net.JoinHostPort("::", strconv.Itoa(int(port)))
	err := ns.Do(func() error {
		var err error
		if b.tcp, err = net.Listen("tcp", addr); err != nil {
			return err
		}
		if b.udp, err = net.ListenPacket("udp", addr); err != nil {
			b.tcp.Close()
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatalf("backend %s in %s on port %d: %v", name, ns.Name, port, err)
	}
	b.wg.Add(2)
	go b.serveTCP()
	go b.serveUDP()
	t.Cleanup(b.Stop)
	return b
}

// Stop closes the backend's sockets and waits for its goroutines. New
// connections to its port are then refused. Stop may be called more than
// once.
func (b *Backend) Stop() {
	b.once.Do(func() {
		b.tcp.Close()
		b.udp.Close()
		b.wg.Wait()
	})
}

func (b *Backend) serveTCP() {
	defer b.wg.Done()
	for {
		conn, err := b.tcp.Accept()
		if err != nil {
			return
		}
		client := addrIP(conn.RemoteAddr())
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = fmt.Fprintf(conn, "%s %s\n", b.Name, client)
		conn.Close()
	}
}

func (b *Backend) serveUDP() {
	defer b.wg.Done()
	buf := make([]byte, 1500)
	for {
		_, from, err := b.udp.ReadFrom(buf)
		if err != nil {
			return
		}
		_, _ = b.udp.WriteTo(fmt.Appendf(nil, "%s %s\n", b.Name, addrIP(from)), from)
	}
}

func addrIP(a net.Addr) netip.Addr {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// Reply is what a [Backend] answered.
type Reply struct {
	// Name is the backend's name.
	Name string
	// Client is the source address the backend saw.
	Client netip.Addr
}

// Dial connects from namespace ns to dst over network ("tcp" or "udp") and
// returns the backend's reply. The whole exchange is bounded by timeout. A
// refused connection returns an error that matches syscall.ECONNREFUSED
// (for UDP, from the ICMP port-unreachable the kernel delivers); one that
// got no answer returns an error whose Timeout() is true.
func Dial(ns *NS, network string, dst netip.AddrPort, timeout time.Duration) (Reply, error) {
	return DialFrom(ns, network, netip.Addr{}, dst, timeout)
}

// DialFrom is [Dial] from a chosen source address of ns; a zero src lets the
// kernel choose.
func DialFrom(ns *NS, network string, src netip.Addr, dst netip.AddrPort, timeout time.Duration) (Reply, error) {
	var line string
	err := ns.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		d := net.Dialer{}
		if src.IsValid() {
			switch network {
			case "tcp":
				d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
			case "udp":
				d.LocalAddr = &net.UDPAddr{IP: src.AsSlice()}
			}
		}
		conn, err := d.DialContext(ctx, network, dst.String())
		if err != nil {
			return err
		}
		defer conn.Close()
		deadline, _ := ctx.Deadline()
		_ = conn.SetDeadline(deadline)
		if network == "udp" {
			if _, err := conn.Write([]byte("hello\n")); err != nil {
				return err
			}
		}
		line, err = bufio.NewReader(conn).ReadString('\n')
		return err
	})
	if err != nil {
		return Reply{}, fmt.Errorf("%s from %s to %s: %w", network, ns.Name, dst, err)
	}
	name, client, ok := strings.Cut(strings.TrimSpace(line), " ")
	if !ok {
		return Reply{}, fmt.Errorf("%s from %s to %s: malformed reply %q", network, ns.Name, dst, line)
	}
	ip, err := netip.ParseAddr(client)
	if err != nil {
		return Reply{}, fmt.Errorf("%s from %s to %s: malformed reply %q: %w", network, ns.Name, dst, line, err)
	}
	return Reply{Name: name, Client: ip}, nil
}

// IsTimeout reports whether err from [Dial] means that no answer came in
// time (as opposed to a refusal or a reset).
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
