package conntrack_test

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/conntrack/conntracktest"
)

// BenchmarkCleanStaleEntries measures one cleanup of a table with ten flows
// per service, one in ten of them stale, against the fake (the cost of
// CleanStaleEntries itself, not of netlink).
func BenchmarkCleanStaleEntries(b *testing.B) {
	for _, size := range []struct{ services, endpoints int }{{1000, 10}, {1000, 100}, {10000, 10}} {
		b.Run(fmt.Sprintf("services=%d/endpoints=%d", size.services, size.endpoints), func(b *testing.B) {
			var ports []svc
			var bes []backends
			var flows []conntrack.Flow
			for i := range size.services {
				s := svc{name: fmt.Sprintf("s%d", i), port: "p", proto: v1.ProtocolUDP,
					clusterIP: fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), portNum: 53}
				if i < 2000 {
					s.nodePort = int32(30000 + i) // node ports are unique
				}
				ports = append(ports, s)
				var eps []ep
				for e := range size.endpoints {
					eps = append(eps, ep{addr: fmt.Sprintf("10.%d.%d.%d:5353", 1+i/250, i%250, e+1)})
				}
				bes = append(bes, backends{s, eps})
				for f := range 10 {
					backend := eps[f%len(eps)].addr
					if f == 0 {
						backend = "10.250.0.1:5353" // gone
					}
					flows = append(flows, udp(fmt.Sprintf("10.0.%d.%d:%d", f, i%250, 10000+i), s.clusterIP+":53", backend))
				}
			}
			svcs := servicePortMap(b, v1.IPv4Protocol, ports...)
			eps := endpointsMap(bes...)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				fake := conntracktest.NewFake()
				if err := fake.AddFlows(flows...); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				n, err := conntrack.NewCleaner(fake).CleanStaleEntries(ctx, v1.IPv4Protocol, svcs, eps, nil)
				if err != nil || n != size.services {
					b.Fatalf("deleted %d, %v; want %d", n, err, size.services)
				}
			}
		})
	}
}
