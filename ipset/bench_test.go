package ipset_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/ipset/ipsettest"
)

// desiredOf returns a hash:ip,port set with n members, the first skip of a
// sequence of n+skip left out.
func desiredOf(n, skip int) []ipset.Desired {
	d := ipset.Desired{Set: ipset.Set{Name: "PK-CLUSTER-IP", Type: ipset.HashIPPort, HashSize: 16384}}
	d.Entries = make([]ipset.Entry, 0, n)
	for i := skip; i < n+skip; i++ {
		addr := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)})
		d.Entries = append(d.Entries, ipset.IPPortEntry(addr, tcp, 80))
	}
	return []ipset.Desired{d}
}

// BenchmarkIPSetReconcile measures a reconcile of one 10,000-member set
// against the fake: creating it from nothing, a resync with no change, and a
// resync where 1% of the members changed (100 deletions, 100 additions).
// writes/op is the number of kernel operations each needed.
func BenchmarkIPSetReconcile(b *testing.B) {
	const n = 10000
	ctx := context.Background()
	b.Run("10000/create", func(b *testing.B) {
		desired := desiredOf(n, 0)
		var writes int
		for b.Loop() {
			f := ipsettest.NewFake()
			res, err := ipset.NewReconciler(f, "PK-").Reconcile(ctx, desired)
			if err != nil {
				b.Fatal(err)
			}
			writes += res.Writes
		}
		b.ReportMetric(float64(writes)/float64(b.N), "writes/op")
	})
	b.Run("10000/unchanged", func(b *testing.B) {
		desired := desiredOf(n, 0)
		f := ipsettest.NewFake()
		r := ipset.NewReconciler(f, "PK-")
		if _, err := r.Reconcile(ctx, desired); err != nil {
			b.Fatal(err)
		}
		var writes int
		for b.Loop() {
			res, err := r.Reconcile(ctx, desired)
			if err != nil {
				b.Fatal(err)
			}
			writes += res.Writes
		}
		b.ReportMetric(float64(writes)/float64(b.N), "writes/op")
	})
	b.Run("10000/churn-1pct", func(b *testing.B) {
		states := [2][]ipset.Desired{desiredOf(n, 0), desiredOf(n, 100)}
		f := ipsettest.NewFake()
		r := ipset.NewReconciler(f, "PK-")
		if _, err := r.Reconcile(ctx, states[0]); err != nil {
			b.Fatal(err)
		}
		var writes, i int
		for b.Loop() {
			i++
			res, err := r.Reconcile(ctx, states[i%2])
			if err != nil {
				b.Fatal(err)
			}
			writes += res.Writes
		}
		b.ReportMetric(float64(writes)/float64(b.N), "writes/op")
	})
}
