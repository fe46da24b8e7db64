package iptables_test

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/writertest"
)

// TestFirstSyncPayloadBuffer checks the size of the buffer a first full
// sync writes its payload into: never grown while writing (which would
// allocate it again and copy it), and at most 8 % and 8 KiB above the
// payload, since at tens of megabytes it is most of that sync's heap.
// The clusters have a port of each kind that changes the length of its
// rules, in the writer's two modes: with per-endpoint comments (up to
// 1,000 endpoints) and without.
func TestFirstSyncPayloadBuffer(t *testing.T) {
	kinds := map[string][]writertest.ServiceOption{
		"ClusterIP": nil,
		"NodePort":  {writertest.WithNodePort(30000)},
		"LoadBalancer Local, source ranges": {writertest.WithLoadBalancer("192.0.2.1", "198.51.100.0/24", "203.0.113.0/24"),
			writertest.WithNodePort(30001), writertest.WithExternalLocal(), writertest.WithHealthCheckNodePort(32000)},
		"external IPs, affinity": {writertest.WithExternalIPs("192.0.2.10", "192.0.2.11"), writertest.WithAffinity(600)},
		"internal Local":         {writertest.WithInternalLocal()},
	}
	for kind, opts := range kinds {
		for _, size := range []benchSize{{50, 10}, {500, 10}, {20, 100}} {
			t.Run(fmt.Sprintf("%s/%s", kind, size), func(t *testing.T) {
				c := newCluster(v1.IPv4Protocol, "node-1")
				n := 0
				for i := range size.services {
					name := fmt.Sprintf("service-number-%d", i)
					c.setService(writertest.Service("some-namespace", name, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), opts...))
					var eps []ep
					for range size.endpoints {
						eps = append(eps, ep{IP: fmt.Sprintf("10.%d.%d.%d", 128+n>>16&63, n>>8&255, n&255), Node: fmt.Sprintf("node-%d", n%3)})
						n++
					}
					c.setEndpoints("some-namespace", name, tcp8080, eps...)
				}
				w := benchWriter(t)
				res := w.Sync(context.Background(), c.input())
				got, limit := cap(res.Payload), len(res.Payload)*108/100+8<<10
				if got < len(res.Payload) || got > limit {
					t.Errorf("payload of %d bytes in a buffer of %d; want at most %d", len(res.Payload), got, limit)
				}
			})
		}
	}
}
