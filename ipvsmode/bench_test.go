package ipvsmode_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/proxy"
)

// BenchmarkIPVSTranslate measures a translation of services x endpoints,
// against no kernel, in the cluster of the iptables writer's benchmarks:
// ClusterIP services with one TCP port, endpoints spread over 100 nodes (so
// 1% are local). Every IPVS-mode sync is a full one, so this is the cost of
// each. Run it with:
//
//	go test -run '^$' -bench IPVSTranslate -benchmem ./ipvs/
//
// virtual-servers, set-members and payload-B describe the output.
func BenchmarkIPVSTranslate(b *testing.B) {
	for _, size := range []struct{ services, endpoints int }{{1000, 10}, {10000, 10}} {
		b.Run(fmt.Sprintf("%dx%d", size.services, size.endpoints), func(b *testing.B) {
			ports := make([]svcPort, size.services)
			n := 0
			for i := range ports {
				eps := make([]endpoint, size.endpoints)
				for j := range eps {
					eps[j] = endpoint{ip: fmt.Sprintf("10.%d.%d.%d", 128+n>>16&63, n>>8&255, n&255), local: n%100 == 0}
					n++
				}
				ports[i] = svcPort{name: fmt.Sprintf("bench/svc-%d", i), clusterIP: fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), port: 80, endpoints: eps}
			}
			svcs, eps := portMaps(b, v1.IPv4Protocol, ports...)
			tr, err := ipvsmode.NewWriter(ipvsmode.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: nodeName, ClusterCIDRs: []netip.Prefix{prefix("10.128.0.0/10")}}, RandomFully: true})
			if err != nil {
				b.Fatal(err)
			}
			in := &proxy.FamilyInput{Services: svcs, Endpoints: eps}
			ctx := context.Background()
			tr.Sync(ctx, in) // grows the buffers, as the first sync of a proxier does
			b.ReportAllocs()
			var res ipvsmode.SyncResult
			for b.Loop() {
				res = tr.Sync(ctx, in)
			}
			members := 0
			for _, s := range res.Sets {
				members += len(s.Entries)
			}
			if len(res.Services) != size.services || res.SkippedServicePorts != 0 {
				b.Fatalf("%d virtual servers, %d skipped", len(res.Services), res.SkippedServicePorts)
			}
			b.ReportMetric(float64(len(res.Services)), "virtual-servers")
			b.ReportMetric(float64(members), "set-members")
			b.ReportMetric(float64(len(res.Payload)), "payload-B")
		})
	}
}
