package proxier_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxy"
)

// TestTwoGroupsServeOneFamily checks a family served by two groups, as a
// socket-level Backend beside a packet-level one serves it: each group's
// Backend gets the family's inputs with every Service, a Backend that
// keeps failing holds the other back in nothing, each gets a full sync of
// its own first and after its own lost (and only then), and the family's
// last-sync gauge waits for the failing group.
func TestTwoGroupsServeOneFamily(t *testing.T) {
	const lastSync = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
	client := fake.NewClientset(testNode("192.168.0.1"), testService("web", 80, "10.96.0.10"), testService("db", 5432, "10.96.0.11"),
		testSlice("web", "web-1", discoveryv1.AddressTypeIPv4, "10.244.0.1"))
	socket, packet := newRecordingBackend(), newRecordingBackend()
	socket.failures = 1 << 30
	reg := prometheus.NewRegistry()
	startProxier(t, client, func(context.Context, proxier.Node, *proxy.Metrics) ([]proxier.BackendGroup, error) {
		ipv4 := []v1.IPFamily{v1.IPv4Protocol}
		return []proxier.BackendGroup{{Backend: socket, Families: ipv4}, {Backend: packet, Families: ipv4}}, nil
	}, proxier.WithSyncPeriods(0, time.Hour), proxier.WithRetryPeriod(10*time.Millisecond), proxier.WithMetricsRegisterer(reg))

	want := state{v1.IPv4Protocol: {
		"ns/web:p 10.96.0.10:80/TCP":  {"10.244.0.1:8080"},
		"ns/db:p 10.96.0.11:5432/TCP": {},
	}}
	synced := func(b *recordingBackend, wantFull int) func() error {
		return func() error {
			st, syncs, full := b.snapshot()
			if diff := cmp.Diff(want, st); diff != "" {
				return fmt.Errorf("after %d syncs, state (-want +got):\n%s", syncs, diff)
			}
			if full != wantFull {
				return fmt.Errorf("%d full syncs, want %d", full, wantFull)
			}
			return nil
		}
	}
	eventually(t, "the packet group, while the socket group fails", synced(packet, 1))
	eventually(t, "the socket group retrying", func() error {
		if _, syncs, _ := socket.snapshot(); syncs < 3 {
			return fmt.Errorf("%d syncs", syncs)
		}
		return nil
	})
	if got := gatherFamilies(t, reg, lastSync)[lastSync].Series; len(got) != 0 {
		t.Errorf("last sync gauge %v while a group of IPv4 never synced, want none", got)
	}

	// A change reaches the group that works.
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Create(context.Background(),
		testSlice("db", "db-1", discoveryv1.AddressTypeIPv4, "10.244.0.2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want[v1.IPv4Protocol]["ns/db:p 10.96.0.11:5432/TCP"] = []string{"10.244.0.2:8080"}
	eventually(t, "the packet group after a change", synced(packet, 1))

	// The failing one recovers. Its first input was Full; after a
	// failed Sync the Backend makes its next one whole (proxy.Backend),
	// so the retries are not Full.
	socket.mu.Lock()
	socket.failures = 0
	socket.mu.Unlock()
	eventually(t, "the socket group recovered", synced(socket, 0))
	eventually(t, "the last sync gauge once both groups synced", func() error {
		if got := gatherFamilies(t, reg, lastSync)[lastSync].Series; got["ip_family=IPv4"] == 0 {
			return fmt.Errorf("gauges %v", got)
		}
		return nil
	})

	// Each group's lost brings a full sync of that group alone.
	socketLost, packetLost := <-socket.lost, <-packet.lost
	socketLost()
	eventually(t, "the socket group after its lost", synced(socket, 1))
	if _, _, full := packet.snapshot(); full != 1 {
		t.Errorf("packet group: %d full syncs after the socket group's lost, want 1", full)
	}
	packetLost()
	eventually(t, "the packet group after its lost", synced(packet, 2))
	if _, _, full := socket.snapshot(); full != 1 {
		t.Errorf("socket group: %d full syncs after the packet group's lost, want 1", full)
	}
}

// TestTwoGroupsObserveEachChangeOnce checks that the network programming
// latency of a family served by two groups is observed once per change,
// when the slower group has applied it: nothing while one group fails,
// and each change once after it recovers, however many times each group
// synced.
func TestTwoGroupsObserveEachChangeOnce(t *testing.T) {
	const (
		latency   = "kubeproxy_network_programming_duration_seconds"
		durations = "kubeproxy_sync_proxy_rules_duration_seconds"
		series    = "ip_family=IPv4"
	)
	client := fake.NewClientset(testNode("192.168.0.1"), testService("web", 80, "10.96.0.10"),
		testSlice("web", "web-1", discoveryv1.AddressTypeIPv4, "10.244.0.1"))
	packet, socket := newRecordingBackend(), newRecordingBackend()
	reg := prometheus.NewRegistry()
	startProxier(t, client, func(context.Context, proxier.Node, *proxy.Metrics) ([]proxier.BackendGroup, error) {
		ipv4 := []v1.IPFamily{v1.IPv4Protocol}
		return []proxier.BackendGroup{{Backend: packet, Families: ipv4}, {Backend: socket, Families: ipv4}}, nil
	}, proxier.WithSyncPeriods(0, time.Hour), proxier.WithRetryPeriod(10*time.Millisecond), proxier.WithMetricsRegisterer(reg))

	// has waits until b synced the web Service with endpoints, and until
	// every sync that either group started has been observed, so that
	// what a sync observes is in the registry.
	has := func(what string, b *recordingBackend, endpoints ...string) {
		t.Helper()
		want := map[string][]string{"ns/web:p 10.96.0.10:80/TCP": endpoints}
		eventually(t, what, func() error {
			st, _, _ := b.snapshot()
			if diff := cmp.Diff(want, st[v1.IPv4Protocol]); diff != "" {
				return fmt.Errorf("state (-want +got):\n%s", diff)
			}
			_, p, _ := packet.snapshot()
			_, s, _ := socket.snapshot()
			if got := gatherFamilies(t, reg, durations)[durations].Series[series]; got != float64(p+s) {
				return fmt.Errorf("%v syncs observed of %d", got, p+s)
			}
			return nil
		})
	}
	observed := func() float64 { return gatherFamilies(t, reg, latency)[latency].Series[series] }
	change := func(addr string) {
		t.Helper()
		s := testSlice("web", "web-1", discoveryv1.AddressTypeIPv4, addr)
		// Now: a trigger time from before the trackers started is not
		// measured.
		s.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().Format(time.RFC3339Nano)}
		if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	has("the socket group's first sync", socket, "10.244.0.1:8080")
	has("the packet group's first sync", packet, "10.244.0.1:8080")

	// Both groups apply each change.
	change("10.244.0.2")
	has("the packet group after a change", packet, "10.244.0.2:8080")
	has("the socket group after a change", socket, "10.244.0.2:8080")
	if got := observed(); got != 1 {
		t.Errorf("after one change applied by both groups, %v latencies observed, want 1", got)
	}

	// While the socket group fails, the packet group's syncs observe
	// nothing: the family has not applied the changes.
	socket.mu.Lock()
	socket.failures = 1 << 30
	socket.mu.Unlock()
	change("10.244.0.3")
	has("the packet group while the socket group fails", packet, "10.244.0.3:8080")
	change("10.244.0.4")
	has("the packet group after another change", packet, "10.244.0.4:8080")
	if got := observed(); got != 1 {
		t.Errorf("while a group fails, %v latencies observed, want still 1", got)
	}
	socket.mu.Lock()
	socket.failures = 0
	socket.mu.Unlock()
	has("the socket group recovered", socket, "10.244.0.4:8080")
	if got := observed(); got != 3 {
		t.Errorf("after three changes applied by both groups, %v latencies observed, want 3", got)
	}
}
