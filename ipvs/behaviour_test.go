package ipvs_test

// The behaviour table runs against the fake here and against the kernel in
// the VM tier (TestVMBehaviour), so that the fake is held to what the
// kernel really does.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipvs"
	"github.com/proxykit/proxykit/ipvs/ipvstest"
)

// errAny stands for "some error, of no particular kind".
var errAny = errors.New("any error")

var (
	web     = ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80}
	dns6    = ipvs.VirtualServer{Address: vip6, Protocol: udp, Port: 53, Scheduler: "sh", Flags: ipvs.FlagSched2}
	sticky  = ipvs.VirtualServer{Address: vip, Protocol: udp, Port: 5353, Flags: ipvs.FlagPersistent, Timeout: 10800}
	missing = ipvs.VirtualServer{Address: vip, Protocol: v1.ProtocolSCTP, Port: 9}
	rs1     = ipvs.RealServer{Address: ep1, Port: 8080, Weight: 1}
	rs2     = ipvs.RealServer{Address: ep2, Port: 8080, Weight: 1}
	rs6     = ipvs.RealServer{Address: ep6, Port: 53, Weight: 1}
)

type step struct {
	desc string
	do   func(ctx context.Context, i ipvs.Interface) error
	want error
}

var behaviour = []step{
	{"add a virtual server", func(ctx context.Context, i ipvs.Interface) error { return i.AddVirtualServer(ctx, web) }, nil},
	{"add it again", func(ctx context.Context, i ipvs.Interface) error { return i.AddVirtualServer(ctx, web) }, ipvs.ErrAlreadyExists},
	{"add it again with other settings", func(ctx context.Context, i ipvs.Interface) error {
		vs := web
		vs.Scheduler = "lc"
		return i.AddVirtualServer(ctx, vs)
	}, ipvs.ErrAlreadyExists},
	{"add an IPv6 source-hashing one", func(ctx context.Context, i ipvs.Interface) error { return i.AddVirtualServer(ctx, dns6) }, nil},
	{"add a persistent one", func(ctx context.Context, i ipvs.Interface) error { return i.AddVirtualServer(ctx, sticky) }, nil},
	{"add one with an unknown scheduler", func(ctx context.Context, i ipvs.Interface) error {
		vs := missing
		vs.Scheduler = "fastest"
		return i.AddVirtualServer(ctx, vs)
	}, ipvs.ErrInvalid},
	{"update a missing one", func(ctx context.Context, i ipvs.Interface) error { return i.UpdateVirtualServer(ctx, missing) }, ipvs.ErrNotFound},
	{"delete a missing one", func(ctx context.Context, i ipvs.Interface) error { return i.DeleteVirtualServer(ctx, missing) }, ipvs.ErrNotFound},
	{"get a missing one", func(ctx context.Context, i ipvs.Interface) error {
		_, err := i.GetVirtualServer(ctx, missing)
		return err
	}, ipvs.ErrNotFound},
	{"change the scheduler", func(ctx context.Context, i ipvs.Interface) error {
		vs := web
		vs.Scheduler = "wrr"
		return i.UpdateVirtualServer(ctx, vs)
	}, nil},
	{"get it back", func(ctx context.Context, i ipvs.Interface) error {
		got, err := i.GetVirtualServer(ctx, ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80})
		if err == nil && got != (ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80, Scheduler: "wrr"}) {
			return fmt.Errorf("got %+v", got)
		}
		return err
	}, nil},
	{"add a real server", func(ctx context.Context, i ipvs.Interface) error { return i.AddRealServer(ctx, web, rs1) }, nil},
	{"add it again", func(ctx context.Context, i ipvs.Interface) error { return i.AddRealServer(ctx, web, rs1) }, ipvs.ErrAlreadyExists},
	{"add a second", func(ctx context.Context, i ipvs.Interface) error { return i.AddRealServer(ctx, web, rs2) }, nil},
	{"add one to a missing virtual server", func(ctx context.Context, i ipvs.Interface) error { return i.AddRealServer(ctx, missing, rs1) }, ipvs.ErrNotFound},
	{"add an IPv6 one to an IPv4 virtual server", func(ctx context.Context, i ipvs.Interface) error { return i.AddRealServer(ctx, web, rs6) }, ipvs.ErrInvalid},
	{"add an IPv6 one", func(ctx context.Context, i ipvs.Interface) error { return i.AddRealServer(ctx, dns6, rs6) }, nil},
	{"set a weight", func(ctx context.Context, i ipvs.Interface) error {
		rs := rs2
		rs.Weight = 5
		return i.UpdateRealServer(ctx, web, rs)
	}, nil},
	{"update a missing real server", func(ctx context.Context, i ipvs.Interface) error {
		rs := rs1
		rs.Port = 1
		return i.UpdateRealServer(ctx, web, rs)
	}, ipvs.ErrNotFound},
	{"update one of a missing virtual server", func(ctx context.Context, i ipvs.Interface) error { return i.UpdateRealServer(ctx, missing, rs1) }, ipvs.ErrNotFound},
	{"delete a missing real server", func(ctx context.Context, i ipvs.Interface) error {
		rs := rs1
		rs.Port = 1
		return i.DeleteRealServer(ctx, web, rs)
	}, ipvs.ErrNotFound},
	{"list the real servers of a missing virtual server", func(ctx context.Context, i ipvs.Interface) error {
		list, err := i.ListRealServers(ctx, missing)
		if err == nil && len(list) != 0 {
			return fmt.Errorf("got %v", list)
		}
		return err
	}, nil},
	{"a batch with one failing op", func(ctx context.Context, i ipvs.Interface) error {
		b, ok := i.(ipvs.Batcher)
		if !ok {
			return errors.New("not a Batcher")
		}
		ops := []ipvs.Op{
			{Kind: ipvs.AddRealServer, VirtualServer: sticky, RealServer: ipvs.RealServer{Address: ep1, Port: 5353, Weight: 2}},
			{Kind: ipvs.AddRealServer, VirtualServer: web, RealServer: rs1}, // exists
			{Kind: ipvs.AddRealServer, VirtualServer: web, RealServer: rs6}, // invalid
			{Kind: ipvs.UpdateRealServer, VirtualServer: web, RealServer: ipvs.RealServer{Address: ep1, Port: 8080, Weight: 3}},
			{Kind: ipvs.AddVirtualServer, VirtualServer: missing},
			{Kind: ipvs.DeleteVirtualServer, VirtualServer: missing},
		}
		err := b.ApplyBatch(ctx, ops)
		var be *ipvs.BatchError
		if !errors.As(err, &be) || len(be.Failed) != 2 || be.Failed[0].Index != 1 || be.Failed[1].Index != 2 ||
			!ipvs.IsAlreadyExists(be.Failed[0].Err) || !errors.Is(be.Failed[1].Err, ipvs.ErrInvalid) {
			return fmt.Errorf("ApplyBatch = %v (%+v)", err, be)
		}
		return nil
	}, nil},
	{"set timeouts", func(ctx context.Context, i ipvs.Interface) error {
		return i.SetTimeouts(ctx, ipvs.Timeouts{TCP: 1000 * time.Second, UDP: 60 * time.Second})
	}, nil},
	{"read them back", func(ctx context.Context, i ipvs.Interface) error {
		got, err := i.Timeouts(ctx)
		if want := (ipvs.Timeouts{TCP: 1000 * time.Second, TCPFin: 120 * time.Second, UDP: 60 * time.Second}); err == nil && got != want {
			return fmt.Errorf("got %v, want %v", got, want)
		}
		return err
	}, nil},
	{"set a timeout that is not whole seconds", func(ctx context.Context, i ipvs.Interface) error {
		return i.SetTimeouts(ctx, ipvs.Timeouts{TCP: 1500 * time.Millisecond})
	}, ipvs.ErrInvalid},
	{"delete a virtual server with real servers", func(ctx context.Context, i ipvs.Interface) error {
		if err := i.AddVirtualServer(ctx, ipvs.VirtualServer{Address: ep2, Protocol: tcp, Port: 1}); err != nil {
			return err
		}
		if err := i.AddRealServer(ctx, ipvs.VirtualServer{Address: ep2, Protocol: tcp, Port: 1}, rs1); err != nil {
			return err
		}
		return i.DeleteVirtualServer(ctx, ipvs.VirtualServer{Address: ep2, Protocol: tcp, Port: 1})
	}, nil},
}

// behaviourEnd is the state the behaviour table leaves.
const behaviourEnd = `TCP 10.96.0.1:80 wrr
  -> 10.244.1.1:8080 weight 3
  -> 10.244.2.1:8080 weight 5
UDP 10.96.0.1:5353 rr persistent 10800
  -> 10.244.1.1:5353 weight 2
UDP [fd00:96::1]:53 sh flags 0x10
  -> [fd00:244::1]:53 weight 1
`

func runBehaviour(t *testing.T, i ipvs.Interface) {
	ctx := context.Background()
	for _, s := range behaviour {
		err := s.do(ctx, i)
		switch {
		case s.want == nil && err != nil:
			t.Errorf("%s: unexpected error %v", s.desc, err)
		case s.want == errAny && err == nil, s.want != nil && s.want != errAny && !errors.Is(err, s.want):
			t.Errorf("%s: got error %v, want %v", s.desc, err, s.want)
		}
	}
	if diff := cmp.Diff(behaviourEnd, dump(t, i)); diff != "" {
		t.Errorf("state after the behaviour table (-want +got):\n%s", diff)
	}
	if err := i.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if got := dump(t, i); got != "" {
		t.Errorf("after Flush:\n%s", got)
	}
}

// dump renders the virtual and real servers of i in the format of
// ipvstest.Fake.Dump, through the Interface alone.
func dump(t *testing.T, i ipvs.Interface) string {
	t.Helper()
	ctx := context.Background()
	list, err := i.ListVirtualServers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f := ipvstest.NewFake()
	for _, vs := range list {
		if err := f.AddVirtualServer(ctx, vs); err != nil {
			t.Fatal(err)
		}
		rss, err := i.ListRealServers(ctx, vs)
		if err != nil {
			t.Fatal(err)
		}
		for _, rs := range rss {
			if err := f.AddRealServer(ctx, vs, rs); err != nil {
				t.Fatal(err)
			}
			if err := f.SetConnections(vs, rs, rs.ActiveConn, rs.InactiveConn); err != nil {
				t.Fatal(err)
			}
		}
	}
	return f.Dump()
}

func TestFakeBehaviour(t *testing.T) {
	f := ipvstest.NewFake()
	runBehaviour(t, f)
	if c := f.Counts(); c.Batches != 1 || c.Flush != 1 {
		t.Errorf("counts %+v", c)
	}
}

func TestFakeSchedulers(t *testing.T) {
	ctx := context.Background()
	f := ipvstest.NewFake()
	f.SetSchedulers("rr")
	vs := web
	vs.Scheduler = "wrr"
	if err := f.AddVirtualServer(ctx, vs); !errors.Is(err, ipvs.ErrNotSupported) || !strings.Contains(err.Error(), "wrr") {
		t.Errorf("unavailable scheduler: %v", err)
	}
	if err := f.AddVirtualServer(ctx, web); err != nil {
		t.Error(err)
	}
	f.SetSchedulers()
	if err := f.UpdateVirtualServer(ctx, vs); err != nil {
		t.Error(err)
	}
}
