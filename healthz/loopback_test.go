package healthz

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
)

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

// TestLoopbackPorts runs both servers on real sockets, on 127.0.0.1 only.
func TestLoopbackPorts(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := &http.Client{Timeout: 10 * time.Second}

	// The proxy health server, on a port the kernel picks.
	addrs := make(chan net.Addr, 1)
	listen := func(ctx context.Context, network, address string) (net.Listener, error) {
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, network, address)
		if err == nil {
			addrs <- ln.Addr()
		}
		return ln, err
	}
	hs := NewProxyHealthServer("127.0.0.1:0", time.Hour, WithListenFunc(listen))
	done := make(chan error, 1)
	go func() { done <- hs.Run(ctx) }()
	hsAddr := (<-addrs).String()
	hs.Updated(v1.IPv4Protocol)
	resp, err := client.Get("http://" + hsAddr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	if code, body := decode(t, resp); code != 200 || body["nodeEligible"] != true {
		t.Errorf("/healthz on %s: %d %v", hsAddr, code, body)
	}

	// Service health: A and B on free ports, C on a port someone else holds.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	ports := map[types.NamespacedName]uint16{
		svcA: freePort(t),
		svcB: freePort(t),
		svcC: uint16(busy.Addr().(*net.TCPAddr).Port),
	}
	s := NewServiceHealthServer("node-1", hs, WithNodeAddresses(netip.MustParseAddr("127.0.0.1")))
	defer s.Close()
	s.SyncEndpoints(map[types.NamespacedName]int{svcA: 2, svcC: 1})
	err = s.SyncServices(ctx, ports)
	var be *BindError
	if !errors.As(err, &be) || be.Service != svcC || !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("SyncServices = %v, want a BindError for %s with EADDRINUSE", err, svcC)
	}
	for _, tc := range []struct {
		name types.NamespacedName
		code int
		body map[string]any
	}{
		{svcA, 200, serviceBody(svcA, 2, true)},
		{svcB, 503, serviceBody(svcB, 0, true)},
	} {
		url := "http://127.0.0.1:" + strconv.Itoa(int(ports[tc.name])) + "/"
		resp, err := client.Get(url)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		code, body := decode(t, resp)
		if code != tc.code {
			t.Errorf("%s: status %d, want %d", tc.name, code, tc.code)
		}
		if diff := cmp.Diff(tc.body, body); diff != "" {
			t.Errorf("%s: body (-want +got):\n%s", tc.name, diff)
		}
	}

	// B goes away: its port is closed for real, A's keeps answering.
	bURL := "http://127.0.0.1:" + strconv.Itoa(int(ports[svcB])) + "/"
	delete(ports, svcB)
	delete(ports, svcC)
	if err := s.SyncServices(ctx, ports); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Get(bURL); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("GET on B's port after B went away: %v, want connection refused", err)
	}
	resp, err = client.Get("http://127.0.0.1:" + strconv.Itoa(int(ports[svcA])) + "/")
	if err != nil {
		t.Fatalf("A after B went away: %v", err)
	}
	if code, _ := decode(t, resp); code != 200 {
		t.Errorf("A after B went away: %d", code)
	}

	cancel()
	if err := <-done; err != nil {
		t.Errorf("proxy health Run: %v", err)
	}
}
