package shortconn_test

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/internal/testkit/ruleload"
)

// endpointReplies returns what the server answers a client that reached the
// measured Service's endpoints: each endpoint's address and port.
func endpointReplies() []string {
	var out []string
	for _, a := range podEndpoints {
		out = append(out, netip.AddrPortFrom(a, backendPort).String())
	}
	return out
}

// TestShortConnReach is the benchmark's premise, checked on 10 Services
// in every mode, with the benchmark's client process and server: the
// client's connections to the Service that sorts last reach both of its
// endpoints; iptables mode's KUBE-SERVICES matches that Service last (a
// new connection to it is matched against every other rule first); in
// the nftables and iptables modes the node NATs the connections (its
// conntrack entries are to the cluster IP), in the ebpf modes they pass
// the node already addressed to an endpoint (no entry is to the cluster
// IP; beside nftables, whose nat chains make the node track
// connections, every one has an entry to an endpoint).
func TestShortConnReach(t *testing.T) {
	const n, conns = 10, 40
	c := newCluster(t, n)
	for _, m := range allModes {
		t.Run(string(m), func(t *testing.T) {
			kerneltest.Require(t, m.tools()...)
			r := newRig(t, m, c)
			if r.ipt != nil {
				order, err := ruleload.ServiceOrder(r.nw.Node, r.ipt)
				if err != nil {
					t.Fatal(err)
				}
				if len(order) != n || order[n-1] != c.last.Addr() {
					t.Errorf("KUBE-SERVICES matches %v; want %d Services, %s last", order, n, c.last.Addr())
				}
			}
			res, err := r.client(t, c, 0).measure(conns)
			if err != nil {
				t.Fatalf("client: %v", err)
			}
			if res.Conns != conns || res.P50 <= 0 || res.P99 < res.P50 || res.Elapsed < res.P99 {
				t.Errorf("client reported %d connections, p50 %v, p99 %v in %v; want %d, 0 < p50 <= p99 <= the whole run", res.Conns, res.P50, res.P99, res.Elapsed, conns)
			}
			reached := map[string]bool{}
			for reply := range res.Replies {
				reached[reply] = true
			}
			want := map[string]bool{}
			for _, e := range endpointReplies() {
				want[e] = true
			}
			if diff := cmp.Diff(want, reached); diff != "" {
				t.Errorf("endpoints reached from %s (-want +got):\n%s", c.last, diff)
			}

			toService, toEndpoint := r.tracked(t, c)
			switch {
			case !m.ebpf() && toService < conns:
				t.Errorf("the node tracks %d connections to %s, want the %d the client made (NATed by the node)", toService, c.last, conns)
			case m.ebpf() && toService != 0:
				t.Errorf("the node tracks %d connections to %s, want none (translated at connect)", toService, c.last)
			case m == modeEBPF && toEndpoint < conns:
				t.Errorf("the node tracks %d connections to the endpoints, want the %d the client made", toEndpoint, conns)
			}
		})
	}
}

// tracked counts the node's conntrack entries whose original
// destination is c's measured Service and those whose original
// destination is one of its endpoints.
func (r *rig) tracked(t *testing.T, c *cluster) (toService, toEndpoint int) {
	t.Helper()
	flows, err := r.nw.Node.Netlink(t).ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		t.Fatalf("listing the node's conntrack table: %v", err)
	}
	for _, f := range flows {
		dst, ok := netip.AddrFromSlice(f.Forward.DstIP)
		if !ok || f.Forward.Protocol != unix.IPPROTO_TCP {
			continue
		}
		dst = dst.Unmap()
		switch {
		case dst == c.last.Addr() && f.Forward.DstPort == c.last.Port():
			toService++
		case (dst == podEndpoints[0] || dst == podEndpoints[1]) && f.Forward.DstPort == backendPort:
			toEndpoint++
		}
	}
	return toService, toEndpoint
}

// warmUp is how many connections a client makes before it is measured.
const warmUp = 200

// BenchmarkShortConnections measures short connections (connect, write a
// one-line request, read the one-line reply, close) from the client to
// the Service that sorts last among 1,000 and 30,000 Services of two
// endpoints, in each mode (see the package's doc), one connection at a
// time, b.N of them, after warmUp more. It reports the client's
// connections a second, and the p50 and p99 of one connection's
// duration. Every mode's network is built and programmed first; then the
// modes run one after another, PROXYKIT_SHORTCONN_ROUNDS times (default
// 1) in a rotating order, so that a change in a shared machine's load
// falls on all of them alike.
func BenchmarkShortConnections(b *testing.B) {
	modes := modesFromEnv(b)
	for _, m := range modes {
		kerneltest.Require(b, m.tools()...)
	}
	rounds := 1
	if s := os.Getenv("PROXYKIT_SHORTCONN_ROUNDS"); s != "" {
		var err error
		if rounds, err = strconv.Atoi(s); err != nil || rounds < 1 {
			b.Fatalf("PROXYKIT_SHORTCONN_ROUNDS=%q: want a positive count", s)
		}
	}
	for _, n := range []int{1000, 30000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			c := newCluster(b, n)
			rigs := map[mode]*rig{}
			for _, m := range modes {
				rigs[m] = newRig(b, m, c)
				b.Logf("%d Services: %s programmed in %v", n, m, rigs[m].load.Round(time.Millisecond))
			}
			for round := range rounds {
				for i := range modes {
					m := modes[(i+round)%len(modes)]
					b.Run(string(m), func(b *testing.B) { rigs[m].bench(b, c) })
				}
			}
		})
	}
}

// bench measures b.N connections of a new client of the rig.
func (r *rig) bench(b *testing.B, c *cluster) {
	p := r.client(b, c, warmUp)
	b.ResetTimer()
	res, err := p.measure(b.N)
	b.StopTimer()
	if err != nil {
		b.Fatalf("%s: %v", r.mode, err)
	}
	var endpoints int
	for _, e := range endpointReplies() {
		endpoints += res.Replies[e]
	}
	if endpoints != b.N {
		b.Fatalf("%s: replies %v, want %d from the endpoints %v", r.mode, res.Replies, b.N, endpointReplies())
	}
	b.ReportMetric(float64(res.Conns)/res.Elapsed.Seconds(), "conns/s")
	b.ReportMetric(float64(res.P50)/float64(time.Microsecond), "p50-µs")
	b.ReportMetric(float64(res.P99)/float64(time.Microsecond), "p99-µs")
}
