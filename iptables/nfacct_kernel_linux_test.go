package iptables_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/internal/testkit/metricstest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/proxy"
)

// TestModeKernelNFAcct runs iptables mode with kube-proxy's nfacct
// counters in a node namespace: the rules count in them with kube-proxy's
// rule text, a connection to a node port on 127.0.0.1 moves the localhost
// counter by its one NATed packet, and a TCP ACK that conntrack cannot
// place, forwarded by the node, is dropped and moves the INVALID counter;
// each metric reads its counter.
func TestModeKernelNFAcct(t *testing.T) {
	for _, backend := range []iptables.Backend{iptables.BackendLegacy, iptables.BackendNFT} {
		t.Run(string(backend), func(t *testing.T) {
			kerneltest.Require(t, kernelTools(backend)...)
			ctx := context.Background()
			k := newKernelNode(t, backend)
			acct, err := iptables.NewNFAcct("/run/netns/" + k.node.Name)
			if err != nil {
				t.Fatalf("NewNFAcct: %v", err)
			}
			k.node.Sysctl(t, "net.ipv4.conf.all.route_localnet", "1")
			// A mid-stream packet of an unknown connection is INVALID,
			// instead of starting one.
			k.node.Sysctl(t, "net.netfilter.nf_conntrack_tcp_loose", "0")
			cfg := scnWriterConfig(k.ipt.HasRandomFully())
			cfg.LocalhostNodePorts = true
			reg := metricstest.NewRegistry()
			var m *iptables.Mode
			if err := k.node.Do(func() error {
				var err error
				if m, err = iptables.NewMode(ctx, cfg, k.ipt, iptables.WithNFAcct(acct), iptables.WithMetrics(reg.Metrics)); err != nil {
					return err
				}
				in := k.c.input()
				in.Family = v1.IPv4Protocol
				_, err = m.Sync(ctx, []*proxy.FamilyInput{in})
				return err
			}); err != nil {
				t.Fatal(err)
			}

			// iptables-save prints two spaces after --nfacct-name.
			one := strings.NewReplacer("--nfacct-name  ", "--nfacct-name ")
			filter, nat := one.Replace(string(k.save(t, iptables.TableFilter))), one.Replace(string(k.save(t, iptables.TableNAT)))
			for _, want := range []string{
				"-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP\n",
			} {
				if !strings.Contains(filter, want) {
					t.Errorf("filter table lacks %q:\n%s", want, filter)
				}
			}
			// iptables-save prints -d and -p before the matches.
			wantNat := fmt.Sprintf("-m tcp --dport %d -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-", scnNodePort)
			found := false
			for _, line := range strings.Split(nat, "\n") {
				found = found || strings.HasPrefix(line, "-A KUBE-NODEPORTS -d 127.0.0.0/8 -p tcp ") && strings.Contains(line, wantNat)
			}
			if !found {
				t.Errorf("nat table lacks a rule ending in %q:\n%s", wantNat, nat)
			}

			const (
				invalid   = "kubeproxy_iptables_ct_state_invalid_dropped_packets_total"
				localhost = "kubeproxy_iptables_localhost_nodeports_accepted_packets_total"
			)
			for _, name := range []string{invalid, localhost} {
				if got := reg.Value(t, name); got != 0 {
					t.Errorf("%s before any traffic = %v, want 0", name, got)
				}
			}
			dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), scnNodePort)
			if r, err := kerneltest.Dial(k.node, "tcp", dst, 3*time.Second); err != nil {
				t.Fatalf("%s: %v", dst, err)
			} else if r.Name != "pod-a" && r.Name != "pod-b" {
				t.Fatalf("%s reached %q, want an endpoint", dst, r.Name)
			}
			if got := reg.Value(t, localhost); got != 1 {
				t.Errorf("%s after one connection = %v, want 1", localhost, got)
			}

			sendStrayACK(t, k.client, netip.MustParseAddr(scnClientIP), netip.MustParseAddr(scnPodA))
			var got float64
			for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if got = reg.Value(t, invalid); got != 0 {
					break
				}
			}
			if got != 1 {
				t.Errorf("%s after one stray ACK = %v, want 1", invalid, got)
			}
			c, err := acct.Get(ctx, iptables.NFAcctInvalidDropped)
			if err != nil || c.Packets != 1 || c.Bytes == 0 {
				t.Errorf("Get(%s) = %+v, %v; want 1 packet", iptables.NFAcctInvalidDropped, c, err)
			}
		})
	}
}

// TestNFAcctKernel checks the netlink client on its own: a missing
// counter is IsNotFound, Ensure makes it at zero, a second Ensure keeps
// it, and a name the kernel would refuse is refused.
func TestNFAcctKernel(t *testing.T) {
	kerneltest.Require(t)
	ns := kerneltest.NewNS(t)
	acct, err := iptables.NewNFAcct("/run/netns/" + ns.Name)
	if err != nil {
		t.Fatalf("NewNFAcct: %v", err)
	}
	ctx := context.Background()
	if _, err := acct.Get(ctx, "proxykit-test"); !iptables.IsNotFound(err) {
		t.Fatalf("Get of a missing counter: %v, want IsNotFound", err)
	}
	for range 2 {
		if err := acct.Ensure(ctx, "proxykit-test"); err != nil {
			t.Fatalf("Ensure: %v", err)
		}
	}
	c, err := acct.Get(ctx, "proxykit-test")
	if err != nil || c != (iptables.NFAcctCounter{Name: "proxykit-test"}) {
		t.Errorf("Get = %+v, %v; want a zero counter", c, err)
	}
	// The host's namespace has no such counter: the client spoke to ns.
	if host, err := iptables.NewNFAcct(""); err == nil {
		if _, err := host.Get(ctx, "proxykit-test"); !iptables.IsNotFound(err) {
			t.Errorf("the counter is in the host's namespace too (%v)", err)
		}
	}
	for _, bad := range []string{"", strings.Repeat("x", iptables.NFAcctNameMax+1)} {
		if err := acct.Ensure(ctx, bad); err == nil {
			t.Errorf("Ensure(%q): no error", bad)
		}
	}
}

// sendStrayACK sends, from ns, one TCP ACK from src to dst:80 that
// belongs to no connection.
func sendStrayACK(t *testing.T, ns *kerneltest.NS, src, dst netip.Addr) {
	t.Helper()
	seg := make([]byte, 20)
	binary.BigEndian.PutUint16(seg[0:], 40000)
	binary.BigEndian.PutUint16(seg[2:], 80)
	binary.BigEndian.PutUint32(seg[4:], 12345)
	binary.BigEndian.PutUint32(seg[8:], 67890)
	seg[12] = 5 << 4 // header length: five words
	seg[13] = 0x10   // ACK
	binary.BigEndian.PutUint16(seg[14:], 65535)
	// The checksum covers the pseudo header: addresses, protocol, length.
	sum := uint32(0)
	for _, b := range [][]byte{src.AsSlice(), dst.AsSlice(), {0, syscall.IPPROTO_TCP, 0, byte(len(seg))}, seg} {
		for i := 0; i < len(b); i += 2 {
			sum += uint32(b[i])<<8 | uint32(b[i+1])
		}
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(seg[16:], ^uint16(sum))
	if err := ns.Do(func() error {
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_TCP)
		if err != nil {
			return err
		}
		defer syscall.Close(fd)
		if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: src.As4()}); err != nil {
			return err
		}
		return syscall.Sendto(fd, seg, 0, &syscall.SockaddrInet4{Addr: dst.As4()})
	}); err != nil {
		t.Fatalf("sending a stray ACK: %v", err)
	}
}
