package healthz_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/proxykit/proxykit/healthz"
)

func ExampleProxyHealthServer() {
	clock := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	hs := healthz.NewProxyHealthServer("0.0.0.0:10256", time.Minute, healthz.WithClock(clock))
	status := func() int {
		rec := httptest.NewRecorder()
		hs.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code
	}

	hs.QueuedUpdate(v1.IPv4Protocol) // an event handler saw a change
	clock.SetTime(clock.Now().Add(2 * time.Minute))
	fmt.Println("change pending for 2m:", status())

	hs.Updated(v1.IPv4Protocol) // the sync applied it
	fmt.Println("after the sync:", status())

	hs.SyncNode(&v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: healthz.ToBeDeletedTaint}}}})
	fmt.Println("node about to be deleted:", status())
	// Output:
	// change pending for 2m: 503
	// after the sync: 200
	// node about to be deleted: 503
}

func ExampleServiceHealthServer() {
	ctx := context.Background()
	// Listen on loopback only, for the example; a proxier passes its node
	// port addresses, or nothing for all addresses.
	s := healthz.NewServiceHealthServer("node-1", nil, healthz.WithNodeAddresses(netip.MustParseAddr("127.0.0.1")))
	defer s.Close()

	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	port := ln.Addr().(*net.TCPAddr).Port // a free port, for the example
	ln.Close()

	web := types.NamespacedName{Namespace: "default", Name: "web"}
	if err := s.SyncServices(ctx, map[types.NamespacedName]uint16{web: uint16(port)}); err != nil {
		fmt.Println(err)
		return
	}
	s.SyncEndpoints(map[types.NamespacedName]int{web: 2})

	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	// Output:
	// 200 {"service":{"namespace":"default","name":"web"},"localEndpoints":2,"serviceProxyHealthy":true}
}
