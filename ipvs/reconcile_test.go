package ipvs_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvs/ipvstest"
)

// load fills i with the state text describes, in the format of
// ipvstest.Fake.Dump; connection counts are set in fake, if not nil.
func load(t *testing.T, i ipvs.Interface, fake *ipvstest.Fake, text string) {
	t.Helper()
	ctx := context.Background()
	var vs ipvs.VirtualServer
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if f[0] == "->" {
			ap := netip.MustParseAddrPort(f[1])
			rs := ipvs.RealServer{Address: ap.Addr(), Port: ap.Port()}
			opts := options(t, f[2:])
			rs.Weight = opts["weight"]
			if err := i.AddRealServer(ctx, vs, rs); err != nil {
				t.Fatalf("loading %q: %v", line, err)
			}
			if fake != nil && (opts["active"] != 0 || opts["inactive"] != 0) {
				if err := fake.SetConnections(vs, rs, opts["active"], opts["inactive"]); err != nil {
					t.Fatal(err)
				}
			}
			continue
		}
		ap := netip.MustParseAddrPort(f[1])
		vs = ipvs.VirtualServer{Address: ap.Addr(), Port: ap.Port(), Protocol: v1.Protocol(f[0]), Scheduler: f[2]}
		opts := options(t, f[3:])
		vs.Flags = ipvs.Flags(opts["flags"])
		if p, ok := opts["persistent"]; ok {
			vs.Flags |= ipvs.FlagPersistent
			vs.Timeout = uint32(p)
		}
		if err := i.AddVirtualServer(ctx, vs); err != nil {
			t.Fatalf("loading %q: %v", line, err)
		}
	}
}

func options(t *testing.T, f []string) map[string]int {
	t.Helper()
	m := map[string]int{}
	for i := 0; i+1 < len(f); i += 2 {
		n, err := strconv.ParseInt(f[i+1], 0, 64)
		if err != nil {
			t.Fatalf("option %s %s: %v", f[i], f[i+1], err)
		}
		m[f[i]] = int(n)
	}
	return m
}

// noBatch hides the Batcher of an Interface, to test the call-per-write
// path.
type noBatch struct{ ipvs.Interface }

var nodeIP = netip.MustParseAddr("192.168.0.10")

func svcs() []ipvs.Service {
	return []ipvs.Service{
		{VirtualServer: web, RealServers: []ipvs.RealServer{rs1, rs2}, Bind: true},
		{VirtualServer: sticky, RealServers: []ipvs.RealServer{{Address: ep1, Port: 5353, Weight: 1}}, Bind: true},
		{VirtualServer: ipvs.VirtualServer{Address: nodeIP, Protocol: tcp, Port: 30080}, RealServers: []ipvs.RealServer{rs1}},
	}
}

const svcsDump = `TCP 10.96.0.1:80 rr
  -> 10.244.1.1:8080 weight 1
  -> 10.244.2.1:8080 weight 1
UDP 10.96.0.1:5353 rr persistent 10800
  -> 10.244.1.1:5353 weight 1
TCP 192.168.0.10:30080 rr
  -> 10.244.1.1:8080 weight 1
`

func withWeb(rss ...ipvs.RealServer) []ipvs.Service {
	return []ipvs.Service{{VirtualServer: web, RealServers: rss, Bind: true}}
}

type reconcileCase struct {
	name     string
	start    string
	bound    []string // addresses on the dummy interface before; nil: no interface
	draining []ipvs.RealServer
	opts     []ipvs.Option
	services []ipvs.Service
	want     string
	wantAddr []string
	result   ipvs.Result
	err      error
	// wantDraining are the real servers of web left draining.
	wantDraining []string
}

var reconcileCases = []reconcileCase{{
	name:     "from nothing",
	services: svcs(),
	want:     svcsDump,
	wantAddr: []string{"10.96.0.1"},
	result:   ipvs.Result{VirtualServersAdded: 3, RealServersAdded: 4, AddressesBound: 1, DeviceCreated: true, Writes: 9},
}, {
	name:     "no change: no writes",
	start:    svcsDump,
	bound:    []string{"10.96.0.1"},
	services: svcs(),
	want:     svcsDump,
	wantAddr: []string{"10.96.0.1"},
	result:   ipvs.Result{RealServerLists: 3},
}, {
	name:     "real servers: exactly the missing, changed and stale ones",
	start:    "TCP 10.96.0.1:80 rr\n  -> 10.244.1.1:8080 weight 1\n  -> 10.244.3.1:8080 weight 1\n",
	bound:    []string{"10.96.0.1"},
	services: withWeb(ipvs.RealServer{Address: ep1, Port: 8080, Weight: 2}, rs2),
	want:     "TCP 10.96.0.1:80 rr\n  -> 10.244.1.1:8080 weight 2\n  -> 10.244.2.1:8080 weight 1\n",
	wantAddr: []string{"10.96.0.1"},
	result:   ipvs.Result{RealServersAdded: 1, RealServersUpdated: 1, RealServersDeleted: 1, RealServerLists: 1, Writes: 3},
}, {
	name:         "a stale real server with connections drains at weight 0",
	start:        "TCP 10.96.0.1:80 rr\n  -> 10.244.1.1:8080 weight 1 active 2 inactive 1\n",
	bound:        []string{"10.96.0.1"},
	services:     withWeb(rs2),
	want:         "TCP 10.96.0.1:80 rr\n  -> 10.244.1.1:8080 weight 0 active 2 inactive 1\n  -> 10.244.2.1:8080 weight 1\n",
	wantAddr:     []string{"10.96.0.1"},
	result:       ipvs.Result{RealServersAdded: 1, RealServersDraining: 1, RealServerLists: 1, Writes: 2},
	wantDraining: []string{"10.244.1.1:8080"},
}, {
	name:     "after a restart, a real server left at weight 0 that is wanted gets its weight back (kubernetes#92019, #108319)",
	start:    "TCP 10.96.0.1:80 rr\n  -> 10.244.1.1:8080 weight 0 active 1 inactive 0\n",
	bound:    []string{"10.96.0.1"},
	services: withWeb(rs1),
	want:     "TCP 10.96.0.1:80 rr\n  -> 10.244.1.1:8080 weight 1 active 1 inactive 0\n",
	wantAddr: []string{"10.96.0.1"},
	result:   ipvs.Result{RealServersUpdated: 1, RealServerLists: 1, Writes: 1},
}, {
	name:         "after a restart, a real server left at weight 0 that is not wanted drains again without a write",
	start:        "TCP 10.96.0.1:80 rr\n  -> 10.244.1.1:8080 weight 0 active 1 inactive 0\n  -> 10.244.2.1:8080 weight 1\n",
	bound:        []string{"10.96.0.1"},
	services:     withWeb(rs2),
	want:         "TCP 10.96.0.1:80 rr\n  -> 10.244.1.1:8080 weight 0 active 1 inactive 0\n  -> 10.244.2.1:8080 weight 1\n",
	wantAddr:     []string{"10.96.0.1"},
	result:       ipvs.Result{RealServersDraining: 1, RealServerLists: 1},
	wantDraining: []string{"10.244.1.1:8080"},
}, {
	name:     "after a restart, an idle real server left at weight 0 is deleted",
	start:    "TCP 10.96.0.1:80 rr\n  -> 10.244.1.1:8080 weight 0\n  -> 10.244.2.1:8080 weight 1\n",
	bound:    []string{"10.96.0.1"},
	services: withWeb(rs2),
	want:     "TCP 10.96.0.1:80 rr\n  -> 10.244.2.1:8080 weight 1\n",
	wantAddr: []string{"10.96.0.1"},
	result:   ipvs.Result{RealServersDeleted: 1, RealServerLists: 1, Writes: 1},
}, {
	name:     "a draining real server that is wanted again: termination cancelled, weight restored",
	start:    "TCP 10.96.0.1:80 rr\n  -> 10.244.1.1:8080 weight 0 active 3 inactive 0\n",
	bound:    []string{"10.96.0.1"},
	draining: []ipvs.RealServer{{Address: ep1, Port: 8080, ActiveConn: 3}},
	services: withWeb(rs1),
	want:     "TCP 10.96.0.1:80 rr\n  -> 10.244.1.1:8080 weight 1 active 3 inactive 0\n",
	wantAddr: []string{"10.96.0.1"},
	result:   ipvs.Result{RealServersUpdated: 1, RealServerLists: 1, Writes: 1},
}, {
	name:  "settings change: one update, real servers kept",
	start: "TCP 10.96.0.1:80 rr\n  -> 10.244.1.1:8080 weight 1\n",
	bound: []string{"10.96.0.1"},
	services: []ipvs.Service{{
		VirtualServer: ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80, Flags: ipvs.FlagPersistent, Timeout: 60},
		RealServers:   []ipvs.RealServer{rs1}, Bind: true,
	}},
	want:     "TCP 10.96.0.1:80 rr persistent 60\n  -> 10.244.1.1:8080 weight 1\n",
	wantAddr: []string{"10.96.0.1"},
	result:   ipvs.Result{VirtualServersUpdated: 1, RealServerLists: 1, Writes: 1},
}, {
	name:     "stale virtual servers and addresses removed; excluded CIDRs left alone",
	start:    "TCP 10.96.0.1:80 rr\n  -> 10.244.1.1:8080 weight 1\nTCP 10.96.0.99:80 rr\n  -> 10.244.9.9:80 weight 1 active 5 inactive 0\nTCP 172.16.0.5:22 rr\n",
	bound:    []string{"10.96.0.1", "10.96.0.99", "fd00::99"},
	opts:     []ipvs.Option{ipvs.WithExcludeCIDRs(netip.MustParsePrefix("172.16.0.0/12"))},
	services: withWeb(rs1),
	want:     "TCP 10.96.0.1:80 rr\n  -> 10.244.1.1:8080 weight 1\nTCP 172.16.0.5:22 rr\n",
	wantAddr: []string{"10.96.0.1"},
	result:   ipvs.Result{VirtualServersDeleted: 1, AddressesUnbound: 2, RealServerLists: 1, Writes: 3},
}, {
	name: "invalid input is skipped and reported; the rest is applied",
	services: []ipvs.Service{
		{VirtualServer: web, RealServers: []ipvs.RealServer{rs1, rs6, {Address: ep2, Port: 8080, Weight: -1}, {Address: ep1, Port: 8080, Weight: 7}}, Bind: true},
		{VirtualServer: ipvs.VirtualServer{Address: vip, Protocol: "ICMP", Port: 1}},
		{VirtualServer: sticky}, {VirtualServer: sticky},
	},
	want:     "TCP 10.96.0.1:80 rr\n  -> 10.244.1.1:8080 weight 1\n",
	wantAddr: []string{"10.96.0.1"},
	result:   ipvs.Result{VirtualServersAdded: 1, RealServersAdded: 1, AddressesBound: 1, DeviceCreated: true, Writes: 4},
	err:      ipvs.ErrInvalid,
}, {
	name:     "an unavailable scheduler fails that virtual server alone",
	services: []ipvs.Service{{VirtualServer: web, RealServers: []ipvs.RealServer{rs1}}, {VirtualServer: dns6, RealServers: []ipvs.RealServer{rs6}}},
	want:     "TCP 10.96.0.1:80 rr\n  -> 10.244.1.1:8080 weight 1\n",
	result:   ipvs.Result{VirtualServersAdded: 1, RealServersAdded: 1, DeviceCreated: true, Writes: 5},
	err:      ipvs.ErrNotSupported,
}}

func runReconcileCase(t *testing.T, i ipvs.Interface, fake *ipvstest.Fake, b ipvs.AddressBinder, tc reconcileCase) *ipvs.Reconciler {
	t.Helper()
	ctx := context.Background()
	load(t, i, fake, tc.start)
	if tc.bound != nil {
		if _, err := b.EnsureDevice(ctx, ipvs.DummyDevice); err != nil {
			t.Fatal(err)
		}
		for _, a := range tc.bound {
			if err := b.Bind(ctx, ipvs.DummyDevice, netip.MustParseAddr(a)); err != nil {
				t.Fatal(err)
			}
		}
	}
	r := ipvs.NewReconciler(i, b, tc.opts...)
	for _, rs := range tc.draining {
		rs.Weight = 1
		if _, err := r.Terminator().Terminate(ctx, web, rs); err != nil {
			t.Fatal(err)
		}
	}
	res, err := r.Reconcile(ctx, tc.services)
	switch {
	case tc.err == nil && err != nil:
		t.Errorf("unexpected error: %v", err)
	case tc.err != nil && !errors.Is(err, tc.err):
		t.Errorf("got error %v, want %v", err, tc.err)
	}
	if diff := cmp.Diff(tc.result, res); diff != "" {
		t.Errorf("Result (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(tc.want, dump(t, i)); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
	addrs, err := b.Addresses(ctx, ipvs.DummyDevice)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range addrs {
		got = append(got, a.String())
	}
	if diff := cmp.Diff(tc.wantAddr, got, cmpopts.SortSlices(func(a, b string) bool { return a < b }), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("addresses on %s (-want +got):\n%s", ipvs.DummyDevice, diff)
	}
	var draining []string
	for _, d := range r.Terminator().Draining() {
		draining = append(draining, d.RealServer.String())
	}
	if diff := cmp.Diff(tc.wantDraining, draining, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("draining (-want +got):\n%s", diff)
	}
	// A second call finds nothing to do, unless a kernel error is to be
	// retried.
	res, _ = r.Reconcile(ctx, tc.services)
	if res.Writes != 0 && (tc.err == nil || errors.Is(tc.err, ipvs.ErrInvalid)) {
		t.Errorf("second call wrote %d times: %+v", res.Writes, res)
	}
	return r
}

func TestFakeReconcile(t *testing.T) {
	for _, batch := range []bool{true, false} {
		for _, tc := range reconcileCases {
			t.Run(fmt.Sprintf("batch=%v/%s", batch, tc.name), func(t *testing.T) {
				f := ipvstest.NewFake()
				if strings.Contains(tc.name, "unavailable scheduler") {
					f.SetSchedulers("rr")
				}
				var i ipvs.Interface = f
				if !batch {
					i = noBatch{f}
				}
				runReconcileCase(t, i, f, ipvstest.NewBinder(), tc)
				if c := f.Counts(); batch && c.Writes() > 0 && c.Batches == 0 {
					t.Errorf("writes did not go through ApplyBatch: %+v", c)
				}
			})
		}
	}
}

func TestReconcileWithoutBinder(t *testing.T) {
	f := ipvstest.NewFake()
	res, err := ipvs.NewReconciler(f, nil).Reconcile(context.Background(), svcs())
	if err != nil {
		t.Fatal(err)
	}
	if res.Writes != 7 || res.DeviceCreated {
		t.Errorf("Result %+v", res)
	}
}

func TestReconcileDeviceConflict(t *testing.T) {
	f, b := ipvstest.NewFake(), ipvstest.NewBinder()
	b.AddOtherLink(ipvs.DummyDevice)
	res, err := ipvs.NewReconciler(f, b).Reconcile(context.Background(), svcs())
	if err == nil || !strings.Contains(err.Error(), "not a dummy") {
		t.Errorf("got %v, want an error about the link", err)
	}
	if res.VirtualServersAdded != 3 {
		t.Errorf("virtual servers were not reconciled without the interface: %+v", res)
	}
}

func TestReconcileFullSyncPeriod(t *testing.T) {
	ctx := context.Background()
	f, b := ipvstest.NewFake(), ipvstest.NewBinder()
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	r := ipvs.NewReconciler(f, b, ipvs.WithFullSyncPeriod(time.Minute), ipvs.WithClock(clk))
	want := svcs()
	if _, err := r.Reconcile(ctx, want); err != nil {
		t.Fatal(err)
	}
	step := func(name string, services []ipvs.Service, lists, writes int) {
		t.Helper()
		res, err := r.Reconcile(ctx, services)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if res.RealServerLists != lists || res.Writes != writes {
			t.Errorf("%s: %d listings and %d writes, want %d and %d (%+v)", name, res.RealServerLists, res.Writes, lists, writes, res)
		}
	}
	step("no change within the period", want, 0, 0)

	// Changes made by someone else go unseen until the period ends.
	if err := f.DeleteRealServer(ctx, web, rs2); err != nil {
		t.Fatal(err)
	}
	if err := b.Unbind(ctx, ipvs.DummyDevice, vip); err != nil {
		t.Fatal(err)
	}
	step("external changes within the period", want, 0, 0)
	clk.SetTime(clk.Now().Add(time.Minute))
	step("full resync", want, 3, 2)
	if addrs, _ := b.Addresses(ctx, ipvs.DummyDevice); len(addrs) != 1 {
		t.Errorf("address not restored: %v", addrs)
	}
	step("no change again", want, 0, 0)

	// A desired change is diffed against what was applied, except that a
	// real server to terminate needs fresh connection counts.
	more := svcs()
	more[0].RealServers = append(more[0].RealServers, ipvs.RealServer{Address: netip.MustParseAddr("10.244.3.1"), Port: 8080, Weight: 1})
	step("a real server added", more, 0, 1)
	if err := f.SetConnections(web, rs2, 1, 0); err != nil {
		t.Fatal(err)
	}
	fewer := svcs()
	fewer[0].RealServers = []ipvs.RealServer{rs1}
	step("two real servers removed, one connected", fewer, 1, 2)
	if got := r.Terminator().Draining(); len(got) != 1 || got[0].RealServer.Address != ep2 {
		t.Errorf("draining %v, want rs2", got)
	}
	step("while draining, that virtual server is listed each time", fewer, 1, 0)
}

func TestReconcileKernelListingFails(t *testing.T) {
	boom := errors.New("boom")
	_, err := ipvs.NewReconciler(failingList{ipvstest.NewFake(), boom}, nil).Reconcile(context.Background(), svcs())
	if !errors.Is(err, boom) {
		t.Errorf("got %v, want the listing error", err)
	}
}

type failingList struct {
	ipvs.Interface
	err error
}

func (f failingList) ListVirtualServers(context.Context) ([]ipvs.VirtualServer, error) {
	return nil, f.err
}
