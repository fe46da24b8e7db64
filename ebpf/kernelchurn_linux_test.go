package ebpf_test

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/internal/testkit/writertest"
)

// TestKernelChurn: two Services whose endpoints are the same addresses on
// different ports (so that an endpoint id freed by one and reused by the
// other would show as the wrong port), one of them with ClientIP
// affinity, go through many endpoint changes, each a partial sync, with
// TCP connections and UDP datagrams between them: every one reaches an
// endpoint of its Service's current set (as the server saw it), never a
// removed one, and a Service left without endpoints refuses. At the end
// the kernel's maps hold exactly what the writer wrote.
func TestKernelChurn(t *testing.T) {
	forFamilies(t, func(t *testing.T, l *lab) {
		networks, udp := []string{"10.3.0.0/24"}, "udp4"
		if l.family == v1.IPv6Protocol {
			networks, udp = []string{"fd00:3::/64"}, "udp6"
		}
		const n = 6
		_, servers := l.addrBackends(t, networks, n, 8080, 8081)
		backends := servers[0]
		l.waitReachable(t, backends, 8080)
		type service struct {
			name    string
			ip      netip.Addr
			target  uint16
			members []bool
		}
		svcIP := netip.MustParseAddr(l.svcIP)
		svcs := []*service{
			{name: "web", ip: svcIP, target: 8080, members: make([]bool, n)},
			{name: "api", ip: svcIP.Next(), target: 8081, members: make([]bool, n)},
		}
		for i, s := range svcs {
			opts := []writertest.ServiceOption{writertest.WithPorts(
				v1.ServicePort{Name: "p", Port: 80, Protocol: v1.ProtocolTCP},
				v1.ServicePort{Name: "u", Port: 53, Protocol: v1.ProtocolUDP})}
			if i == 1 {
				opts = append(opts, writertest.WithAffinity(600))
			}
			l.c.SetService(writertest.Service("ns", s.name, s.ip.String(), opts...))
		}
		seed := uint64(time.Now().UnixNano())
		t.Logf("seed %d", seed)
		rng := rand.New(rand.NewPCG(seed, 0))
		const rounds = 24
		for round := range rounds {
			for _, s := range svcs {
				switch {
				case round%8 == 7:
					// Now and then a Service loses every endpoint.
					clear(s.members)
				default:
					for range 1 + rng.IntN(2) {
						i := rng.IntN(n)
						s.members[i] = !s.members[i]
					}
				}
				var eps []writertest.Endpoint
				for i, in := range s.members {
					if in {
						eps = append(eps, writertest.Endpoint{IP: backends[i].String(), Node: "node-b"})
					}
				}
				l.c.SetEndpoints("ns", s.name, []discoveryv1.EndpointPort{
					writertest.SlicePort("p", int32(s.target), v1.ProtocolTCP),
					writertest.SlicePort("u", int32(s.target), v1.ProtocolUDP)}, eps...)
			}
			if r := l.sync(t); round > 0 && r.Full {
				t.Errorf("round %d: a full sync for endpoint changes: %+v", round, r)
			}
			var runs []clientRun
			var allowed [][]string
			for _, s := range svcs {
				for _, p := range []clientRun{{"dial", "tcp", netip.AddrPortFrom(s.ip, 80), 6}, {"sendto", udp, netip.AddrPortFrom(s.ip, 53), 2}} {
					ok := []string{}
					for i, in := range s.members {
						if in {
							ok = append(ok, reached(backends[i], s.target, p.dst))
						}
					}
					if len(ok) == 0 {
						ok = []string{"error ECONNREFUSED"}
					}
					runs = append(runs, p)
					allowed = append(allowed, ok)
				}
			}
			for i, lines := range l.runAll(t, runs) {
				for _, line := range lines {
					if !slices.Contains(allowed[i], line) {
						t.Errorf("round %d: %s %s reached %q; want one of %q", round, runs[i].network, runs[i].dst, line, allowed[i])
					}
				}
			}
		}
		if n, err := l.w.Drift(); err != nil || n != 0 {
			t.Errorf("Drift() after the churn = %d, %v; want 0, nil", n, err)
		}
		st, err := l.dp.Dump()
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(l.w.Written(), st, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
			t.Errorf("maps after the churn (-written +kernel):\n%s", diff)
		}
		checkCleanup(t, l.cfg, l.dp)
	})
}
