package firstpacket_test

import (
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
)

// TestFirstPacketReach is the measurement's premise, checked on 10
// services: through each writer's rules, connections to the service that
// sorts first reach pod "first" only, and to the one that sorts last pod
// "last" only; the iptables writers' KUBE-SERVICES matches the services
// in that order (so the last one is matched against every other rule
// first), and the nftables writer's verdict map holds every service.
func TestFirstPacketReach(t *testing.T) {
	const n, conns = 10, 30
	c := newCluster(t, n)
	for _, kind := range allKinds {
		t.Run(string(kind), func(t *testing.T) {
			kerneltest.Require(t, kind.tools()...)
			r := newRig(t, kind, c)
			if kind == kindNFTables {
				got, err := r.serviceElements()
				if err != nil {
					t.Fatal(err)
				}
				if got != n {
					t.Errorf("service-ips holds %d elements for port %d, want %d", got, servicePort, n)
				}
			} else {
				order, err := r.serviceOrder()
				if err != nil {
					t.Fatal(err)
				}
				if len(order) != n || order[0] != c.firstIP || order[n-1] != c.lastIP {
					t.Errorf("KUBE-SERVICES matches %v; want %d services from %s (%s) to %s (%s)", order, n, c.firstIP, c.first, c.lastIP, c.last)
				}
			}
			dsts := []netip.AddrPort{netip.AddrPortFrom(c.firstIP, servicePort), netip.AddrPortFrom(c.lastIP, servicePort)}
			seen, _, err := connect(r.nw.Client, dsts, conns, 7)
			if err != nil {
				t.Fatal(err)
			}
			want := []map[string]int{{"first": conns}, {"last": conns}}
			if diff := cmp.Diff(want, seen); diff != "" {
				t.Errorf("backends reached from %v (-want +got):\n%s", dsts, diff)
			}
		})
	}
}

// TestFirstPacket measures new TCP connections per second from the client
// to the service that sorts first and the one that sorts last, among 1,
// 1,000 and 10,000 services of 10 endpoints, through the nftables writer's
// rules and the iptables writer's (legacy and nft backends), each in its
// own network. A run makes connsPerRun connections to each of the two
// services, one after another (connect, read the one-line reply, reset),
// alternating between them every batch connections; the writers' runs
// are interleaved, in a rotating order, three times. Both are there so
// that a change in the shared machine's load falls on all figures alike.
// It logs every run, the load times and, per size, writer and service,
// the median and the range of the three runs, and how many microseconds a
// connection to the last service takes more than one to the first (from
// the medians). It runs only with PROXYKIT_NFT_BENCH=1:
//
//	PROXYKIT_NFT_BENCH=1 PROXYKIT_REQUIRE_KERNEL=1 go test ./internal/lab/firstpacket -run 'TestFirstPacket$' -count 1 -v -timeout 30m
//
// PROXYKIT_FIRSTPACKET_KINDS (comma-separated, of nftables,
// iptables-legacy, iptables-nft) narrows the writers.
func TestFirstPacket(t *testing.T) {
	if os.Getenv("PROXYKIT_NFT_BENCH") != "1" {
		t.Skip("set PROXYKIT_NFT_BENCH=1 to measure (loads 10,000-service rulesets)")
	}
	const (
		connsPerRun = 10000
		warmUp      = 200
		batch       = 100
		repeats     = 3
	)
	kinds := allKinds
	if s := os.Getenv("PROXYKIT_FIRSTPACKET_KINDS"); s != "" {
		kinds = nil
		for _, k := range strings.Split(s, ",") {
			if !slices.Contains(allKinds, writerKind(k)) {
				t.Fatalf("PROXYKIT_FIRSTPACKET_KINDS: unknown writer %q, want some of %v", k, allKinds)
			}
			kinds = append(kinds, writerKind(k))
		}
	}
	for _, kind := range kinds {
		kerneltest.Require(t, kind.tools()...)
	}
	var summary []string
	for _, n := range []int{1, 1000, 10000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			c := newCluster(t, n)
			labels := []string{"first", "last"}
			dsts := []netip.AddrPort{netip.AddrPortFrom(c.firstIP, servicePort), netip.AddrPortFrom(c.lastIP, servicePort)}
			if n == 1 {
				labels, dsts = labels[1:], dsts[1:] // the same service
			}
			var rigs []*rig
			for _, kind := range kinds {
				r := newRig(t, kind, c)
				t.Logf("%d services: %s loaded in %v", n, kind, r.load.Round(time.Millisecond))
				if _, _, err := connect(r.nw.Client, dsts, warmUp, batch); err != nil {
					t.Fatalf("%s warm-up: %v", kind, err)
				}
				rigs = append(rigs, r)
			}
			rates := map[string][]float64{}
			for rep := range repeats {
				for i := range rigs {
					r := rigs[(i+rep)%len(rigs)]
					seen, took, err := connect(r.nw.Client, dsts, connsPerRun, batch)
					if err != nil {
						t.Fatalf("%s: %v", r.kind, err)
					}
					for j, label := range labels {
						if seen[j][label] != connsPerRun {
							t.Fatalf("%s: %s reached %v, want pod %q only", r.kind, dsts[j], seen[j], label)
						}
						rate := connsPerRun / took[j].Seconds()
						key := string(r.kind) + " " + label
						rates[key] = append(rates[key], rate)
						t.Logf("%d services, run %d: %s, %s service (%s): %.0f conn/s", n, rep+1, r.kind, label, dsts[j], rate)
					}
				}
			}
			for _, kind := range kinds {
				medians := map[string]float64{}
				for _, label := range labels {
					key := string(kind) + " " + label
					rs := slices.Clone(rates[key])
					slices.Sort(rs)
					medians[label] = rs[len(rs)/2]
					line := fmt.Sprintf("%6d services  %-16s %-5s median %5.0f, %5.0f–%5.0f conn/s  (runs %s)",
						n, kind, label, rs[len(rs)/2], rs[0], rs[len(rs)-1], join(rates[key]))
					summary = append(summary, line)
				}
				if len(labels) == 2 {
					// What a connection to the last service costs more than
					// one to the first: the rules in between.
					summary = append(summary, fmt.Sprintf("%6d services  %-16s last − first: %+.0f µs a connection (medians)",
						n, kind, 1e6/medians["last"]-1e6/medians["first"]))
				}
			}
		})
	}
	t.Logf("summary (%d connections a run, %d runs interleaved):\n%s", connsPerRun, repeats, strings.Join(summary, "\n"))
}

func join(rates []float64) string {
	var s []string
	for _, r := range rates {
		s = append(s, fmt.Sprintf("%.0f", r))
	}
	return strings.Join(s, ", ")
}
