package ipvs_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvs/ipvstest"
)

// setup returns a fake with vs holding rs1 and rs2, and the listing of
// those real servers with the given connection counts on rs1.
func setup(t *testing.T, vs ipvs.VirtualServer, active, inactive int) (*ipvstest.Fake, ipvs.RealServer) {
	t.Helper()
	ctx := context.Background()
	f := ipvstest.NewFake()
	if err := f.AddVirtualServer(ctx, vs); err != nil {
		t.Fatal(err)
	}
	for _, rs := range []ipvs.RealServer{rs1, rs2} {
		if err := f.AddRealServer(ctx, vs, rs); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.SetConnections(vs, rs1, active, inactive); err != nil {
		t.Fatal(err)
	}
	listed := rs1
	listed.ActiveConn, listed.InactiveConn = active, inactive
	f.ResetCounts()
	return f, listed
}

func TestTerminate(t *testing.T) {
	sctp := ipvs.VirtualServer{Address: vip, Protocol: v1.ProtocolSCTP, Port: 80}
	udpVS := ipvs.VirtualServer{Address: vip, Protocol: udp, Port: 80}
	for _, tc := range []struct {
		name              string
		vs                ipvs.VirtualServer
		active, inactive  int
		weight            int
		want              ipvs.Termination
		wantDump          string
		wantWrites        int
		wantDrainingAfter bool
	}{{
		name: "TCP with active connections drains", vs: web, active: 2, weight: 1,
		want: ipvs.TerminationDraining, wantWrites: 1, wantDrainingAfter: true,
		wantDump: "TCP 10.96.0.1:80 rr\n  -> 10.244.1.1:8080 weight 0 active 2 inactive 0\n  -> 10.244.2.1:8080 weight 1\n",
	}, {
		name: "TCP with inactive connections drains", vs: web, inactive: 1, weight: 1,
		want: ipvs.TerminationDraining, wantWrites: 1, wantDrainingAfter: true,
		wantDump: "TCP 10.96.0.1:80 rr\n  -> 10.244.1.1:8080 weight 0 active 0 inactive 1\n  -> 10.244.2.1:8080 weight 1\n",
	}, {
		name: "TCP already at weight 0 drains without a write", vs: web, active: 1, weight: 0,
		want: ipvs.TerminationDraining, wantWrites: 0, wantDrainingAfter: true,
		wantDump: "TCP 10.96.0.1:80 rr\n  -> 10.244.1.1:8080 weight 1 active 1 inactive 0\n  -> 10.244.2.1:8080 weight 1\n",
	}, {
		name: "TCP without connections is deleted", vs: web, weight: 1,
		want: ipvs.TerminationDeleted, wantWrites: 1,
		wantDump: "TCP 10.96.0.1:80 rr\n  -> 10.244.2.1:8080 weight 1\n",
	}, {
		name: "UDP is deleted at once", vs: udpVS, active: 3, weight: 1,
		want: ipvs.TerminationDeleted, wantWrites: 1,
		wantDump: "UDP 10.96.0.1:80 rr\n  -> 10.244.2.1:8080 weight 1\n",
	}, {
		name: "SCTP is deleted at once", vs: sctp, active: 3, weight: 1,
		want: ipvs.TerminationDeleted, wantWrites: 1,
		wantDump: "SCTP 10.96.0.1:80 rr\n  -> 10.244.2.1:8080 weight 1\n",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			f, listed := setup(t, tc.vs, tc.active, tc.inactive)
			listed.Weight = tc.weight
			g := ipvs.NewGracefulTerminator(f)
			got, err := g.Terminate(context.Background(), tc.vs, listed)
			if err != nil || got != tc.want {
				t.Fatalf("Terminate = %v, %v; want %v", got, err, tc.want)
			}
			if diff := cmp.Diff(tc.wantDump, f.Dump()); diff != "" {
				t.Errorf("state (-want +got):\n%s", diff)
			}
			if w := f.Counts().Writes(); w != tc.wantWrites {
				t.Errorf("%d writes, want %d", w, tc.wantWrites)
			}
			if g.InProgress(tc.vs, rs1) != tc.wantDrainingAfter {
				t.Errorf("InProgress = %v, want %v", !tc.wantDrainingAfter, tc.wantDrainingAfter)
			}
			// A second Terminate of a draining server does nothing.
			f.ResetCounts()
			if tc.wantDrainingAfter {
				if got, err := g.Terminate(context.Background(), tc.vs, listed); got != ipvs.TerminationDraining || err != nil || f.Counts().Writes() != 0 {
					t.Errorf("second Terminate = %v, %v with %d writes", got, err, f.Counts().Writes())
				}
			}
		})
	}
}

func TestTerminationString(t *testing.T) {
	for _, tc := range []struct {
		t    ipvs.Termination
		want string
	}{{ipvs.TerminationDeleted, "deleted"}, {ipvs.TerminationDraining, "draining"}, {ipvs.Termination(9), "Termination(9)"}} {
		if got := tc.t.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
}

func TestTerminateGoneRealServer(t *testing.T) {
	f, listed := setup(t, web, 0, 0)
	ctx := context.Background()
	if err := f.DeleteRealServer(ctx, web, rs1); err != nil {
		t.Fatal(err)
	}
	g := ipvs.NewGracefulTerminator(f)
	if got, err := g.Terminate(ctx, web, listed); got != ipvs.TerminationDeleted || err != nil {
		t.Errorf("no connections: Terminate = %v, %v", got, err)
	}
	listed.ActiveConn = 1
	if got, err := g.Terminate(ctx, web, listed); got != ipvs.TerminationDeleted || err != nil || g.InProgress(web, rs1) {
		t.Errorf("with connections: Terminate = %v, %v, in progress %v", got, err, g.InProgress(web, rs1))
	}
}

func TestSweepDeletesOnceIdle(t *testing.T) {
	ctx := context.Background()
	f, listed := setup(t, web, 1, 0)
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	g := ipvs.NewGracefulTerminator(f, ipvs.WithClock(clk))
	if _, err := g.Terminate(ctx, web, listed); err != nil {
		t.Fatal(err)
	}
	drained := rs1
	drained.Weight, drained.ActiveConn = 0, 1
	want := []ipvs.Draining{{VirtualServer: web, RealServer: drained, Since: time.Unix(1000, 0)}}
	if diff := cmp.Diff(want, g.Draining(), cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("Draining (-want +got):\n%s", diff)
	}
	// Active, then inactive: kept.
	for _, conns := range [][2]int{{1, 0}, {0, 1}} {
		if err := f.SetConnections(web, rs1, conns[0], conns[1]); err != nil {
			t.Fatal(err)
		}
		if n, err := g.Sweep(ctx); n != 0 || err != nil || !g.InProgress(web, rs1) {
			t.Fatalf("sweep with connections %v: deleted %d, %v", conns, n, err)
		}
	}
	if err := f.SetConnections(web, rs1, 0, 0); err != nil {
		t.Fatal(err)
	}
	if n, err := g.Sweep(ctx); n != 1 || err != nil {
		t.Fatalf("idle sweep: deleted %d, %v", n, err)
	}
	if g.InProgress(web, rs1) || len(g.Draining()) != 0 {
		t.Errorf("still draining after deletion: %v", g.Draining())
	}
	if got, want := f.Dump(), "TCP 10.96.0.1:80 rr\n  -> 10.244.2.1:8080 weight 1\n"; got != want {
		t.Errorf("state:\n%s\nwant:\n%s", got, want)
	}
}

func TestSweepDropsVanishedAndCancelAndForget(t *testing.T) {
	ctx := context.Background()
	f, listed := setup(t, web, 1, 0)
	g := ipvs.NewGracefulTerminator(f)
	if _, err := g.Terminate(ctx, web, listed); err != nil {
		t.Fatal(err)
	}
	// Deleted by someone else: dropped by the sweep without a write.
	if err := f.DeleteRealServer(ctx, web, rs1); err != nil {
		t.Fatal(err)
	}
	f.ResetCounts()
	if n, err := g.Sweep(ctx); n != 0 || err != nil || g.InProgress(web, rs1) || f.Counts().Writes() != 0 {
		t.Errorf("vanished: deleted %d, %v, in progress %v, writes %d", n, err, g.InProgress(web, rs1), f.Counts().Writes())
	}

	listed2 := rs2
	listed2.ActiveConn = 1
	if _, err := g.Terminate(ctx, web, listed2); err != nil {
		t.Fatal(err)
	}
	if !g.Cancel(web, rs2) || g.Cancel(web, rs2) || g.InProgress(web, rs2) {
		t.Error("Cancel did not report and end the termination once")
	}
	if _, err := g.Terminate(ctx, web, listed2); err != nil {
		t.Fatal(err)
	}
	g.Forget(ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80, Scheduler: "wrr"})
	if len(g.Draining()) != 0 {
		t.Errorf("Forget left %v", g.Draining())
	}
}

// TestRunSweepsOnTicks checks that Run sweeps when its period has passed on
// its clock: the default one, the one WithSweepPeriod gives, and the one a
// Reconciler hands to the terminator it makes.
func TestRunSweepsOnTicks(t *testing.T) {
	for _, tc := range []struct {
		name string
		make func(ipvs.Interface, ...ipvs.Option) *ipvs.GracefulTerminator
		opts []ipvs.Option
		step time.Duration
	}{
		{name: "default period", make: ipvs.NewGracefulTerminator, step: ipvs.DefaultSweepPeriod},
		{name: "WithSweepPeriod", make: ipvs.NewGracefulTerminator, opts: []ipvs.Option{ipvs.WithSweepPeriod(10 * time.Second)}, step: 10 * time.Second},
		{name: "zero period means the default", make: ipvs.NewGracefulTerminator, opts: []ipvs.Option{ipvs.WithSweepPeriod(0)}, step: ipvs.DefaultSweepPeriod},
		{
			name: "the reconciler's own terminator",
			make: func(i ipvs.Interface, opts ...ipvs.Option) *ipvs.GracefulTerminator {
				return ipvs.NewReconciler(i, nil, opts...).Terminator()
			},
			opts: []ipvs.Option{ipvs.WithSweepPeriod(10 * time.Second)},
			step: 10 * time.Second,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			f, listed := setup(t, web, 1, 0)
			clk := clocktesting.NewFakeClock(time.Unix(0, 0))
			g := tc.make(f, append([]ipvs.Option{ipvs.WithClock(clk)}, tc.opts...)...)
			if _, err := g.Terminate(ctx, web, listed); err != nil {
				t.Fatal(err)
			}
			if err := f.SetConnections(web, rs1, 0, 0); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() {
				g.Run(ctx)
				close(done)
			}()
			for !clk.HasWaiters() {
				time.Sleep(time.Millisecond) // until Run has made its ticker
			}
			if g.InProgress(web, rs1) == false {
				t.Fatal("swept before the first tick")
			}
			clk.Step(tc.step)
			// A bound on waiting, not a timing assertion: a ticker of
			// another period never fires, and the test must end.
			for deadline := time.Now().Add(10 * time.Second); g.InProgress(web, rs1); {
				if time.Now().After(deadline) {
					t.Fatalf("no sweep after %v on the clock", tc.step)
				}
				time.Sleep(time.Millisecond) // until the sweep of that tick is done
			}
			cancel()
			<-done
			if got, want := f.Dump(), "TCP 10.96.0.1:80 rr\n  -> 10.244.2.1:8080 weight 1\n"; got != want {
				t.Errorf("state:\n%s", got)
			}
		})
	}
}
