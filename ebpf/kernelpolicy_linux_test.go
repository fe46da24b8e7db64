package ebpf_test

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/writertest"
)

// TestKernelLocalPolicies: under internalTrafficPolicy and
// externalTrafficPolicy Local, with endpoints on this node and on
// another, ready, terminating and not ready, a socket of the node reaches
// exactly the endpoints CategorizeEndpoints selected for the address it
// connects to: the local ones (or, without a ready one, the local
// serving-terminating ones) at the cluster IP under internalTrafficPolicy
// Local, and the cluster's at a node port or external IP under either
// external policy, which kube-proxy short-circuits for traffic from the
// node. Without an endpoint there connect is refused. The server's view
// of the connection names the endpoint; getpeername names the address
// connected to.
func TestKernelLocalPolicies(t *testing.T) {
	const (
		here  = writertest.Node
		there = "node-b"
	)
	type ep struct {
		i                     int // which of the backend addresses
		node                  string
		notReady, terminating bool
	}
	var refused []int
	cases := []struct {
		name string
		opts []writertest.ServiceOption
		eps  []ep
		// The endpoints reached at the cluster IP (internal) and at the
		// node port and external IP (external); nil: connect is refused.
		internal, external []int
		// noLocal is whether the port counts in
		// SyncResult.NoLocalEndpointsInternal.
		noLocal bool
	}{{
		name:     "internal Local, endpoints here and there",
		opts:     []writertest.ServiceOption{writertest.WithInternalLocal()},
		eps:      []ep{{i: 0, node: here}, {i: 1, node: there}},
		internal: []int{0}, external: []int{0, 1},
	}, {
		// kube-proxy drops the cluster IP's packets here; a socket is
		// refused at connect instead (see the Writer's godoc).
		name:     "internal Local, none ready here",
		opts:     []writertest.ServiceOption{writertest.WithInternalLocal()},
		eps:      []ep{{i: 0, node: here, notReady: true}, {i: 1, node: there}},
		internal: refused, external: []int{1},
		noLocal: true,
	}, {
		name:     "external Local, endpoints here and there",
		opts:     []writertest.ServiceOption{writertest.WithExternalLocal()},
		eps:      []ep{{i: 0, node: here}, {i: 1, node: there}, {i: 2, node: there, notReady: true}},
		internal: []int{0, 1}, external: []int{0, 1},
	}, {
		name:     "external Local, none here",
		opts:     []writertest.ServiceOption{writertest.WithExternalLocal()},
		eps:      []ep{{i: 0, node: here, notReady: true}, {i: 1, node: there}},
		internal: []int{1}, external: []int{1},
	}, {
		name:     "both Local, only a terminating endpoint here",
		opts:     []writertest.ServiceOption{writertest.WithInternalLocal(), writertest.WithExternalLocal()},
		eps:      []ep{{i: 0, node: here, terminating: true}, {i: 1, node: there}, {i: 2, node: there, terminating: true}},
		internal: []int{0}, external: []int{1},
	}, {
		name:     "both Local, none ready anywhere",
		opts:     []writertest.ServiceOption{writertest.WithInternalLocal(), writertest.WithExternalLocal()},
		eps:      []ep{{i: 0, node: here, notReady: true}, {i: 1, node: there, notReady: true}},
		internal: refused, external: refused,
	}}
	forFamilies(t, func(t *testing.T, l *lab) {
		networks, svcNet, extNet := []string{"10.3.0.0/24"}, "10.96.1.0", "192.0.2.0"
		if l.family == v1.IPv6Protocol {
			networks, svcNet, extNet = []string{"fd00:3::/64"}, "fd00:96:1::", "2001:db8::"
		}
		client, servers := l.addrBackends(t, networks, 3, 8080)
		nodeIP, backends := client[0], servers[0]
		l.c.NodeIPs = []netip.Addr{nodeIP}
		// Every case is a Service of its own, all programmed at once.
		nth := func(base string, i int) netip.Addr {
			a := netip.MustParseAddr(base)
			for range 10 + i {
				a = a.Next()
			}
			return a
		}
		wantNoLocal := 0
		for i, tc := range cases {
			name := fmt.Sprintf("svc%d", i)
			opts := append([]writertest.ServiceOption{
				writertest.WithNodePort(int32(30080 + i)),
				writertest.WithExternalIPs(nth(extNet, i).String()),
			}, tc.opts...)
			l.c.SetService(writertest.Service("ns", name, nth(svcNet, i).String(), opts...))
			var eps []writertest.Endpoint
			for _, e := range tc.eps {
				eps = append(eps, writertest.Endpoint{IP: backends[e.i].String(), Node: e.node, NotReady: e.notReady, Terminating: e.terminating})
			}
			l.c.SetEndpoints("ns", name, writertest.TCP8080, eps...)
			if tc.noLocal {
				wantNoLocal++
			}
		}
		r := l.sync(t)
		if diff := cmp.Diff(wantNoLocal, r.NoLocalEndpointsInternal); diff != "" {
			t.Errorf("SyncResult.NoLocalEndpointsInternal (-want +got):\n%s", diff)
		}
		want := func(fr netip.AddrPort, eps []int) []string {
			if eps == nil {
				return []string{"error ECONNREFUSED"}
			}
			var out []string
			for _, i := range eps {
				out = append(out, reached(backends[i], 8080, fr))
			}
			return uniq(out)
		}
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				frontends := []struct {
					kind string
					addr netip.AddrPort
					eps  []int
				}{
					{"cluster IP", netip.AddrPortFrom(nth(svcNet, i), 80), tc.internal},
					{"node port", netip.AddrPortFrom(nodeIP, uint16(30080+i)), tc.external},
					{"external IP", netip.AddrPortFrom(nth(extNet, i), 80), tc.external},
				}
				// 40 connections miss one of two endpoints with a chance
				// of 2^-39.
				var runs []clientRun
				for _, fr := range frontends {
					runs = append(runs, clientRun{"dial", "tcp", fr.addr, 40})
				}
				for j, lines := range l.runAll(t, runs) {
					fr := frontends[j]
					if diff := cmp.Diff(want(fr.addr, fr.eps), uniq(lines)); diff != "" {
						t.Errorf("%s %s (-want +got):\n%s", fr.kind, fr.addr, diff)
					}
				}
			})
		}
		checkCleanup(t, l.cfg, l.dp)
	})
}
