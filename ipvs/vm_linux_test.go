package ipvs_test

// Tests against the kernel's IPVS. The machines that run `go test ./...`
// have no IPVS, so these run in the VM tier only: hack/vmtest/run.sh ./ipvs
// boots a stock kernel whose init sets PROXYKIT_VM=1 (and
// PROXYKIT_REQUIRE_KERNEL=1, so that nothing there may skip). Elsewhere
// they skip, even under PROXYKIT_REQUIRE_KERNEL=1.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/internal/testkit/ipvsvm"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/ipvs"
)

func TestVMBehaviour(t *testing.T) {
	_, n, _ := ipvsvm.NS(t)
	runBehaviour(t, n)
}

func TestVMReconcile(t *testing.T) {
	for _, tc := range reconcileCases {
		// Connection counts cannot be set on a kernel, and every
		// scheduler is loaded in the VM.
		if strings.Contains(tc.start, "active") || tc.draining != nil || tc.err == ipvs.ErrNotSupported {
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			_, n, b := ipvsvm.NS(t)
			runReconcileCase(t, n, nil, b, tc)
		})
	}
}

func TestVMDummyBinder(t *testing.T) {
	ns, _, b := ipvsvm.NS(t)
	ctx := context.Background()
	a4, a6 := netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00:96::1")
	if _, err := b.Addresses(ctx, ipvs.DummyDevice); !ipvs.IsNotFound(err) {
		t.Errorf("Addresses of a missing interface: %v", err)
	}
	if err := b.Bind(ctx, ipvs.DummyDevice, a4); !ipvs.IsNotFound(err) {
		t.Errorf("Bind to a missing interface: %v", err)
	}
	for i, want := range []bool{true, false} {
		if created, err := b.EnsureDevice(ctx, ipvs.DummyDevice); created != want || err != nil {
			t.Errorf("EnsureDevice #%d = %v, %v; want %v", i+1, created, err, want)
		}
	}
	for _, a := range []netip.Addr{a4, a6} {
		if err := b.Bind(ctx, ipvs.DummyDevice, a); err != nil {
			t.Fatal(err)
		}
		if err := b.Bind(ctx, ipvs.DummyDevice, a); !ipvs.IsAlreadyExists(err) {
			t.Errorf("binding %s twice: %v", a, err)
		}
	}
	got, err := b.Addresses(ctx, ipvs.DummyDevice)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{a4.String(), a6.String()}, ipvsvm.AddrStrings(got)); diff != "" {
		t.Errorf("Addresses (-want +got):\n%s", diff)
	}
	out := ns.MustExec(t, "ip", "-o", "addr", "show", "dev", ipvs.DummyDevice)
	if !strings.Contains(out, "10.96.0.1/32") || !strings.Contains(out, "fd00:96::1/128") {
		t.Errorf("ip addr shows:\n%s", out)
	}
	if err := b.Unbind(ctx, ipvs.DummyDevice, a6); err != nil {
		t.Fatal(err)
	}
	if err := b.Unbind(ctx, ipvs.DummyDevice, a6); !ipvs.IsNotFound(err) {
		t.Errorf("unbinding twice: %v", err)
	}
	if err := b.DeleteDevice(ctx, ipvs.DummyDevice); err != nil {
		t.Fatal(err)
	}
	if err := b.DeleteDevice(ctx, ipvs.DummyDevice); err != nil {
		t.Errorf("deleting a missing interface: %v", err)
	}
	// Another program deletes the interface the binder has used: the
	// binder says it is gone, not that it has no addresses.
	if _, err := b.EnsureDevice(ctx, ipvs.DummyDevice); err != nil {
		t.Fatal(err)
	}
	if err := b.Bind(ctx, ipvs.DummyDevice, a4); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Addresses(ctx, ipvs.DummyDevice); err != nil || len(got) != 1 {
		t.Fatalf("Addresses = %v, %v; want %s", got, err, a4)
	}
	ns.MustExec(t, "ip", "link", "del", ipvs.DummyDevice)
	if got, err := b.Addresses(ctx, ipvs.DummyDevice); !ipvs.IsNotFound(err) {
		t.Errorf("Addresses of an interface another program deleted = %v, %v; want not found", got, err)
	}
	other := kerneltest.NewNS(t)
	v := kerneltest.Link(t, ns, other, netip.Prefix{}, netip.Prefix{})
	if _, err := b.EnsureDevice(ctx, v.A); err == nil || !strings.Contains(err.Error(), "veth") {
		t.Errorf("EnsureDevice over a veth: %v", err)
	}
}

func describe(list []ipvs.RealServer) string {
	var b strings.Builder
	for _, rs := range list {
		fmt.Fprintf(&b, "%s weight %d active %d inactive %d; ", rs, rs.Weight, rs.ActiveConn, rs.InactiveConn)
	}
	return b.String()
}

func TestVMTraffic(t *testing.T) {
	tp := ipvsvm.NewTopology(t, 2)
	ctx := context.Background()
	for i, ns := range tp.Backends {
		kerneltest.StartBackend(t, ns, fmt.Sprintf("b%d", i+1), 8080)
	}
	vs := ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80}
	vsUDP := ipvs.VirtualServer{Address: vip, Protocol: udp, Port: 80}
	vsSticky := ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 81, Flags: ipvs.FlagPersistent, Timeout: 300}
	b1 := ipvs.RealServer{Address: tp.BackendIPs[0], Port: 8080, Weight: 1}
	b2 := ipvs.RealServer{Address: tp.BackendIPs[1], Port: 8080, Weight: 1}
	both := []ipvs.RealServer{b1, b2}
	services := []ipvs.Service{
		{VirtualServer: vs, RealServers: both, Bind: true},
		{VirtualServer: vsUDP, RealServers: both, Bind: true},
		{VirtualServer: vsSticky, RealServers: both, Bind: true},
	}
	r := ipvs.NewReconciler(tp.IFace, tp.Binder)
	if _, err := r.Reconcile(ctx, services); err != nil {
		t.Fatal(err)
	}

	t.Run("round robin splits traffic evenly", func(t *testing.T) {
		for _, network := range []string{"tcp", "udp"} {
			got := tp.DialCount(t, network, netip.AddrPortFrom(vip, 80), 10)
			if diff := cmp.Diff(map[string]int{"b1": 5, "b2": 5}, got); diff != "" {
				t.Errorf("%s replies per backend (-want +got):\n%s", network, diff)
			}
		}
	})

	t.Run("ClientIP persistence sticks to one backend", func(t *testing.T) {
		got := tp.DialCount(t, "tcp", netip.AddrPortFrom(vip, 81), 6)
		if len(got) != 1 {
			t.Errorf("replies per backend %v, want all from one", got)
		}
	})

	t.Run("a UDP real server is deleted at once", func(t *testing.T) {
		services[1].RealServers = []ipvs.RealServer{b2}
		res, err := r.Reconcile(ctx, services)
		if err != nil {
			t.Fatal(err)
		}
		if res.RealServersDeleted != 1 || res.RealServersDraining != 0 {
			t.Errorf("Result %+v, want one real server deleted", res)
		}
		if got := tp.DialCount(t, "udp", netip.AddrPortFrom(vip, 80), 4); got["b2"] != 4 {
			t.Errorf("replies per backend %v, want all from b2", got)
		}
	})

	t.Run("unbinding the address and deleting the virtual servers stops traffic", func(t *testing.T) {
		if _, err := r.Reconcile(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := kerneltest.Dial(tp.Client, "tcp", netip.AddrPortFrom(vip, 80), 2*time.Second); err == nil {
			t.Error("the service still answers")
		}
		if list, _ := tp.IFace.ListVirtualServers(ctx); len(list) != 0 {
			t.Errorf("virtual servers left: %v", list)
		}
		if addrs, _ := tp.Binder.Addresses(ctx, ipvs.DummyDevice); len(addrs) != 0 {
			t.Errorf("addresses left: %v", addrs)
		}
	})
}

// holder is a TCP backend that keeps connections open: it answers each
// line a client sends with its name, until the client closes.
type holder struct {
	name string
	ln   net.Listener
	wg   sync.WaitGroup
}

func startHolder(t *testing.T, ns *kerneltest.NS, name string, port uint16) *holder {
	t.Helper()
	h := &holder{name: name}
	err := ns.Do(func() (err error) {
		h.ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		for {
			c, err := h.ln.Accept()
			if err != nil {
				return
			}
			h.wg.Add(1)
			go func() {
				defer h.wg.Done()
				defer c.Close()
				s := bufio.NewScanner(c)
				for s.Scan() {
					if _, err := fmt.Fprintln(c, h.name); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		h.ln.Close()
		h.wg.Wait()
	})
	return h
}

// heldConn is a client connection to a holder.
type heldConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialHeld(t *testing.T, ns *kerneltest.NS, dst netip.AddrPort) *heldConn {
	t.Helper()
	var c net.Conn
	err := ns.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", dst.String(), 5*time.Second)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return &heldConn{c: c, r: bufio.NewReader(c)}
}

// ask sends a line and returns the backend's name.
func (h *heldConn) ask() (string, error) {
	_ = h.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintln(h.c, "who"); err != nil {
		return "", err
	}
	line, err := h.r.ReadString('\n')
	return strings.TrimSpace(line), err
}

func TestVMGracefulTermination(t *testing.T) {
	tp := ipvsvm.NewTopology(t, 2)
	ctx := context.Background()
	startHolder(t, tp.Backends[0], "b1", 9090)
	startHolder(t, tp.Backends[1], "b2", 9090)
	// A short FIN timeout lets a closed connection leave the kernel's
	// table in seconds rather than minutes.
	if err := tp.IFace.SetTimeouts(ctx, ipvs.Timeouts{TCPFin: time.Second}); err != nil {
		t.Fatal(err)
	}
	vs := ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 90}
	dst := netip.AddrPortFrom(vip, 90)
	b1 := ipvs.RealServer{Address: tp.BackendIPs[0], Port: 9090, Weight: 1}
	b2 := ipvs.RealServer{Address: tp.BackendIPs[1], Port: 9090, Weight: 1}
	r := ipvs.NewReconciler(tp.IFace, tp.Binder)
	if _, err := r.Reconcile(ctx, []ipvs.Service{{VirtualServer: vs, RealServers: []ipvs.RealServer{b1, b2}, Bind: true}}); err != nil {
		t.Fatal(err)
	}

	// Hold a connection to b1.
	var held *heldConn
	for range 2 {
		c := dialHeld(t, tp.Client, dst)
		name, err := c.ask()
		if err != nil {
			t.Fatal(err)
		}
		if name == "b1" && held == nil {
			held = c
			continue
		}
		c.c.Close()
	}
	if held == nil {
		t.Fatal("round robin never chose b1")
	}

	res, err := r.Reconcile(ctx, []ipvs.Service{{VirtualServer: vs, RealServers: []ipvs.RealServer{b2}, Bind: true}})
	if err != nil {
		t.Fatal(err)
	}
	if res.RealServersDraining != 1 || res.RealServersDeleted != 0 {
		t.Fatalf("Result %+v, want b1 draining", res)
	}
	list, err := tp.IFace.ListRealServers(ctx, vs)
	if err != nil {
		t.Fatal(err)
	}
	var kb1 ipvs.RealServer
	for _, rs := range list {
		if rs.Address == b1.Address {
			kb1 = rs
		}
	}
	if kb1.Weight != 0 || kb1.ActiveConn < 1 {
		t.Fatalf("b1 in the kernel: %+v, want weight 0 and an active connection", kb1)
	}

	for i := range 6 {
		c := dialHeld(t, tp.Client, dst)
		name, err := c.ask()
		c.c.Close()
		if err != nil || name != "b2" {
			t.Errorf("new connection %d reached %q (%v), want b2", i, name, err)
		}
	}
	if name, err := held.ask(); err != nil || name != "b1" {
		t.Errorf("the held connection to the draining backend: %q, %v", name, err)
	}
	if n, err := r.Terminator().Sweep(ctx); n != 0 || err != nil {
		t.Errorf("sweep while connected deleted %d (%v)", n, err)
	}

	// Close with a reset: IPVS then keeps the connection for its CLOSE
	// timeout (10s) instead of TIME_WAIT's two minutes, which no netlink
	// setting shortens.
	if err := held.c.(*net.TCPConn).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	held.c.Close()
	deadline := time.Now().Add(60 * time.Second)
	for r.Terminator().InProgress(vs, b1) {
		if time.Now().After(deadline) {
			list, _ := tp.IFace.ListRealServers(ctx, vs)
			t.Fatalf("b1 still draining a minute after its connection closed: %s", describe(list))
		}
		time.Sleep(250 * time.Millisecond) // the kernel's connection timers
		if _, err := r.Terminator().Sweep(ctx); err != nil {
			t.Fatal(err)
		}
	}
	list, err = tp.IFace.ListRealServers(ctx, vs)
	if err != nil || len(list) != 1 || list[0].Address != b2.Address || list[0].Weight != 1 {
		t.Errorf("after the sweep: %s (%v), want b2 alone", describe(list), err)
	}
}

// TestVMRestartRestoresWeight: a real server drained by one proxier
// process and wanted again by the next gets its weight back and traffic
// (kubernetes#92019, #108319).
func TestVMRestartRestoresWeight(t *testing.T) {
	tp := ipvsvm.NewTopology(t, 2)
	ctx := context.Background()
	kerneltest.StartBackend(t, tp.Backends[0], "b1", 8080)
	kerneltest.StartBackend(t, tp.Backends[1], "b2", 8080)
	vs := ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80}
	b1 := ipvs.RealServer{Address: tp.BackendIPs[0], Port: 8080, Weight: 1}
	b2 := ipvs.RealServer{Address: tp.BackendIPs[1], Port: 8080, Weight: 1}
	want := []ipvs.Service{{VirtualServer: vs, RealServers: []ipvs.RealServer{b1, b2}, Bind: true}}
	if _, err := ipvs.NewReconciler(tp.IFace, tp.Binder).Reconcile(ctx, want); err != nil {
		t.Fatal(err)
	}
	// What the previous process left: b1 at weight 0.
	drained := b1
	drained.Weight = 0
	if err := tp.IFace.UpdateRealServer(ctx, vs, drained); err != nil {
		t.Fatal(err)
	}
	if got := tp.DialCount(t, "tcp", netip.AddrPortFrom(vip, 80), 4); got["b2"] != 4 {
		t.Fatalf("with b1 at weight 0: %v", got)
	}
	res, err := ipvs.NewReconciler(tp.IFace, tp.Binder).Reconcile(ctx, want)
	if err != nil {
		t.Fatal(err)
	}
	if res.RealServersUpdated != 1 || res.Writes != 1 {
		t.Errorf("Result %+v, want one weight update", res)
	}
	if got := tp.DialCount(t, "tcp", netip.AddrPortFrom(vip, 80), 4); got["b1"] != 2 || got["b2"] != 2 {
		t.Errorf("after the restart: %v, want an even split", got)
	}
}

// TestVMScale applies 10,000 virtual servers with 10 real servers each,
// their addresses bound to the dummy interface, over real netlink, then
// resyncs with no change: once trusting what was applied
// (WithFullSyncPeriod) and once listing every virtual server's real
// servers (the default). Neither resync may write. The same apply without
// the addresses runs in a second namespace, to tell the two costs apart.
// Times are printed as "VMSCALE" lines for BENCHMARKS.md.
func TestVMScale(t *testing.T) {
	const services, reals = 10000, 10
	ctx := context.Background()
	want := scaleServices(services, reals)

	_, n, b := ipvsvm.NS(t)
	r := ipvs.NewReconciler(n, b, ipvs.WithFullSyncPeriod(time.Hour))
	start := time.Now()
	res, err := r.Reconcile(ctx, want)
	apply := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if res.VirtualServersAdded != services || res.RealServersAdded != services*reals || res.AddressesBound != services || res.Writes != services*(reals+2)+1 {
		t.Errorf("apply: %+v", res)
	}

	start = time.Now()
	res, err = r.Reconcile(ctx, want)
	cached := time.Since(start)
	if err != nil || res.Writes != 0 || res.RealServerLists != 0 {
		t.Errorf("resync trusting what was applied: %+v, %v; want no writes and no listings", res, err)
	}

	start = time.Now()
	res, err = ipvs.NewReconciler(n, b).Reconcile(ctx, want)
	full := time.Since(start)
	if err != nil || res.Writes != 0 || res.RealServerLists != services {
		t.Errorf("full resync: %+v, %v; want no writes and %d listings", res, err, services)
	}
	list, err := n.ListVirtualServers(ctx)
	if err != nil || len(list) != services {
		t.Fatalf("%d virtual servers in the kernel (%v)", len(list), err)
	}
	addrs, err := b.Addresses(ctx, ipvs.DummyDevice)
	if err != nil || len(addrs) != services {
		t.Fatalf("%d addresses on %s (%v)", len(addrs), ipvs.DummyDevice, err)
	}

	_, n2, _ := ipvsvm.NS(t)
	start = time.Now()
	res, err = ipvs.NewReconciler(n2, nil).Reconcile(ctx, want)
	ipvsOnly := time.Since(start)
	if err != nil || res.Writes != services*(reals+1) {
		t.Errorf("apply without addresses: %+v, %v", res, err)
	}

	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	fmt.Printf("VMSCALE apply %dx%d with %d addresses: %v (%d writes); IPVS alone: %v (%d writes)\n",
		services, reals, services, ms(apply), services*(reals+2)+1, ms(ipvsOnly), services*(reals+1))
	fmt.Printf("VMSCALE no-change resync trusting what was applied: %v (0 writes, 0 real-server listings)\n", ms(cached))
	fmt.Printf("VMSCALE no-change resync, full: %v (0 writes, %d real-server listings)\n", ms(full), services)
}

// TestVMScaleUnbatched applies 1,000 x 10 with one netlink call per write,
// through github.com/moby/ipvs, and the same batched in another namespace,
// for comparison.
func TestVMScaleUnbatched(t *testing.T) {
	ctx := context.Background()
	want := scaleServices(1000, 10)
	var took [2]time.Duration
	for i, batched := range []bool{false, true} {
		_, n, _ := ipvsvm.NS(t)
		var iface ipvs.Interface = noBatch{n}
		if batched {
			iface = n
		}
		start := time.Now()
		res, err := ipvs.NewReconciler(iface, nil).Reconcile(ctx, want)
		took[i] = time.Since(start)
		if err != nil || res.RealServersAdded != 10000 {
			t.Fatalf("batched=%v: %+v, %v", batched, res, err)
		}
	}
	fmt.Printf("VMSCALE apply 1000x10 one call per write (moby/ipvs): %v; batched: %v\n", took[0].Round(time.Millisecond), took[1].Round(time.Millisecond))
}
