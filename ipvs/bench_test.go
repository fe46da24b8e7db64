package ipvs_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvs/ipvstest"
)

// BenchmarkIPVSReconcile measures reconciles of n virtual servers with m
// real servers each against the fakes: creating everything, a no-change
// resync that lists every virtual server's real servers (the default), one
// that trusts what it applied (WithFullSyncPeriod), and a resync where 1%
// of the services swapped a real server. writes/op and lists/op are the
// kernel operations each needed.
func BenchmarkIPVSReconcile(b *testing.B) {
	ctx := context.Background()
	for _, size := range []struct{ n, m int }{{1000, 10}, {10000, 10}} {
		want := scaleServices(size.n, size.m)
		churned := scaleServices(size.n, size.m)
		for i := 0; i < size.n; i += 100 {
			churned[i].RealServers[0].Port = 9999
		}
		report := func(b *testing.B, res ipvs.Result, writes, lists int) {
			b.ReportMetric(float64(writes)/float64(b.N), "writes/op")
			b.ReportMetric(float64(lists)/float64(b.N), "lists/op")
		}
		name := fmt.Sprintf("%dx%d", size.n, size.m)
		b.Run(name+"/create", func(b *testing.B) {
			var writes, lists int
			var res ipvs.Result
			for b.Loop() {
				var err error
				res, err = ipvs.NewReconciler(ipvstest.NewFake(), ipvstest.NewBinder()).Reconcile(ctx, want)
				if err != nil {
					b.Fatal(err)
				}
				writes, lists = writes+res.Writes, lists+res.RealServerLists
			}
			report(b, res, writes, lists)
		})
		for _, mode := range []struct {
			name string
			opts []ipvs.Option
		}{{"unchanged-full", nil}, {"unchanged-cached", []ipvs.Option{ipvs.WithFullSyncPeriod(time.Hour)}}} {
			b.Run(name+"/"+mode.name, func(b *testing.B) {
				r := ipvs.NewReconciler(ipvstest.NewFake(), ipvstest.NewBinder(), mode.opts...)
				if _, err := r.Reconcile(ctx, want); err != nil {
					b.Fatal(err)
				}
				var writes, lists int
				var res ipvs.Result
				for b.Loop() {
					var err error
					if res, err = r.Reconcile(ctx, want); err != nil {
						b.Fatal(err)
					}
					writes, lists = writes+res.Writes, lists+res.RealServerLists
				}
				report(b, res, writes, lists)
			})
		}
		b.Run(name+"/churn-1pct", func(b *testing.B) {
			r := ipvs.NewReconciler(ipvstest.NewFake(), ipvstest.NewBinder())
			if _, err := r.Reconcile(ctx, want); err != nil {
				b.Fatal(err)
			}
			states := [2][]ipvs.Service{want, churned}
			var writes, lists, i int
			var res ipvs.Result
			for b.Loop() {
				i++
				var err error
				if res, err = r.Reconcile(ctx, states[i%2]); err != nil {
					b.Fatal(err)
				}
				writes, lists = writes+res.Writes, lists+res.RealServerLists
			}
			report(b, res, writes, lists)
		})
	}
}

// scaleServices returns n virtual servers with m real servers each.
func scaleServices(n, m int) []ipvs.Service {
	services := make([]ipvs.Service, n)
	for i := range services {
		addr := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		s := ipvs.Service{VirtualServer: ipvs.VirtualServer{Address: addr, Protocol: tcp, Port: 80}, Bind: true}
		for j := range m {
			s.RealServers = append(s.RealServers, ipvs.RealServer{Address: netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}), Port: uint16(8000 + j), Weight: 1})
		}
		services[i] = s
	}
	return services
}
