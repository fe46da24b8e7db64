package ipvstest

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipvs"
)

var (
	vs = ipvs.VirtualServer{Address: netip.MustParseAddr("10.96.0.1"), Protocol: v1.ProtocolTCP, Port: 80}
	rs = ipvs.RealServer{Address: netip.MustParseAddr("10.244.0.1"), Port: 8080, Weight: 1}
)

func TestCountsAndConnections(t *testing.T) {
	ctx := context.Background()
	f := NewFake()
	_ = f.AddVirtualServer(ctx, vs)
	_ = f.AddVirtualServer(ctx, vs)                   // fails, counted
	_ = f.AddVirtualServer(ctx, ipvs.VirtualServer{}) // invalid, not counted
	_ = f.ApplyBatch(ctx, []ipvs.Op{{Kind: ipvs.AddRealServer, VirtualServer: vs, RealServer: rs}})
	_, _ = f.ListRealServers(ctx, vs)
	_, _ = f.ListVirtualServers(ctx)
	_, _ = f.GetVirtualServer(ctx, vs)
	if err := f.SetConnections(vs, rs, 4, 2); err != nil {
		t.Fatal(err)
	}
	if err := f.SetConnections(vs, ipvs.RealServer{Address: rs.Address, Port: 1}, 1, 1); !ipvs.IsNotFound(err) {
		t.Errorf("SetConnections of a missing real server: %v", err)
	}
	want := Counts{AddVirtualServer: 2, AddRealServer: 1, ListRealServers: 1, ListVirtualServers: 1, GetVirtualServer: 1, Batches: 1}
	if diff := cmp.Diff(want, f.Counts()); diff != "" {
		t.Errorf("Counts (-want +got):\n%s", diff)
	}
	if got := f.Counts().Writes(); got != 3 {
		t.Errorf("Writes() = %d, want 3", got)
	}
	list, _ := f.ListRealServers(ctx, vs)
	if len(list) != 1 || list[0].ActiveConn != 4 || list[0].InactiveConn != 2 {
		t.Errorf("listed %+v", list)
	}
	// A weight update keeps the counts; deleting and re-adding drops them.
	upd := rs
	upd.Weight = 0
	_ = f.UpdateRealServer(ctx, vs, upd)
	_ = f.DeleteRealServer(ctx, vs, rs)
	_ = f.AddRealServer(ctx, vs, ipvs.RealServer{Address: rs.Address, Port: rs.Port, Weight: 1, ActiveConn: 9})
	if got, want := f.Dump(), "TCP 10.96.0.1:80 rr\n  -> 10.244.0.1:8080 weight 1\n"; got != want {
		t.Errorf("Dump:\n%s\nwant:\n%s", got, want)
	}
	f.ResetCounts()
	if f.Counts() != (Counts{}) {
		t.Errorf("ResetCounts left %+v", f.Counts())
	}
}

func TestTimeoutsKeepZeroFields(t *testing.T) {
	ctx := context.Background()
	f := NewFake()
	if err := f.SetTimeouts(ctx, ipvs.Timeouts{UDP: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	got, _ := f.Timeouts(ctx)
	want := DefaultTimeouts
	want.UDP = 10 * time.Second
	if got != want {
		t.Errorf("Timeouts() = %v, want %v", got, want)
	}
	if err := f.SetTimeouts(ctx, ipvs.Timeouts{TCP: -time.Second}); !errors.Is(err, ipvs.ErrInvalid) {
		t.Errorf("negative timeout: %v", err)
	}
}

func TestBinder(t *testing.T) {
	ctx := context.Background()
	b := NewBinder()
	a1, a2 := netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00::1")
	if err := b.Bind(ctx, "kube-ipvs0", a1); !ipvs.IsNotFound(err) {
		t.Errorf("Bind before the interface exists: %v", err)
	}
	if created, err := b.EnsureDevice(ctx, "kube-ipvs0"); !created || err != nil {
		t.Fatalf("EnsureDevice = %v, %v", created, err)
	}
	if created, _ := b.EnsureDevice(ctx, "kube-ipvs0"); created {
		t.Error("EnsureDevice created the interface twice")
	}
	err := b.Bind(ctx, "kube-ipvs0", a1, a2, a1, netip.Addr{})
	if !ipvs.IsAlreadyExists(err) || !errors.Is(err, ipvs.ErrInvalid) {
		t.Errorf("Bind with a repeat and an invalid address: %v", err)
	}
	if errs := err.(interface{ Unwrap() []error }).Unwrap(); len(errs) != 2 {
		t.Errorf("%d per-address errors, want 2: %v", len(errs), errs)
	}
	got, _ := b.Addresses(ctx, "kube-ipvs0")
	if diff := cmp.Diff([]netip.Addr{a1, a2}, got, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
		t.Errorf("Addresses (-want +got):\n%s", diff)
	}
	if err := b.Unbind(ctx, "kube-ipvs0", a2, a2); !ipvs.IsNotFound(err) {
		t.Errorf("Unbind twice: %v", err)
	}
	if w := b.Writes(); w != 6 {
		t.Errorf("Writes() = %d, want 6 (create, three binds, two unbinds)", w)
	}
	_ = b.DeleteDevice(ctx, "kube-ipvs0")
	if _, err := b.Addresses(ctx, "kube-ipvs0"); !ipvs.IsNotFound(err) {
		t.Errorf("Addresses after DeleteDevice: %v", err)
	}
	b.AddOtherLink("br0")
	if _, err := b.EnsureDevice(ctx, "br0"); err == nil {
		t.Error("EnsureDevice over another kind of link succeeded")
	}
}
