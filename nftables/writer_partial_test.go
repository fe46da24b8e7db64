package nftables_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"
)

// TestWriterPartialSync changes one service of a loaded cluster per case
// and checks that the partial transaction touches only that service's
// objects (no flush of a top-level chain, map or set; every per-service
// name it holds is the changed service's), and that the table afterwards
// equals the one a fresh writer's full sync makes.
func TestWriterPartialSync(t *testing.T) {
	load := func(c *cluster) {
		c.setService(makeService("ns", "a", "10.96.0.1", withNodePort(30001), withExternalIPs("192.0.2.1")))
		c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"), remote("10.0.2.1"))
		c.setService(makeService("ns", "b", "10.96.0.2", withAffinity(100)))
		c.setEndpoints("ns", "b", tcp8080, local("10.0.1.2"), remote("10.0.2.2"))
		c.setService(makeService("ns", "c", "10.96.0.3", withLoadBalancer("203.0.113.3", "198.51.100.0/24"), withExternalLocal()))
		c.setEndpoints("ns", "c", tcp8080, local("10.0.1.3"), remote("10.0.2.3"))
	}
	for _, tc := range []struct {
		name    string
		change  func(c *cluster)
		service string // the changed service's "ns/name", in chain names
		// wantOps bounds the number of operations.
		wantOps int
		// kept are endpoints ("ip/port") whose chains must not be
		// rewritten.
		kept []string
	}{
		{"endpoint added", func(c *cluster) {
			c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"), remote("10.0.2.1"), remote("10.0.2.9"))
		}, "ns/a", 25, []string{"10.0.1.1/8080", "10.0.2.1/8080"}}, // the first service of 3 endpoints: 3 shared chains
		{"endpoint removed", func(c *cluster) {
			c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"))
		}, "ns/a", 25, []string{"10.0.1.1/8080"}},
		{"affinity endpoint removed", func(c *cluster) {
			c.setEndpoints("ns", "b", tcp8080, local("10.0.1.2"))
		}, "ns/b", 20, []string{"10.0.1.2/8080"}},
		{"all endpoints gone", func(c *cluster) { c.setEndpoints("ns", "a", tcp8080) }, "ns/a", 20, nil},
		{"service deleted", func(c *cluster) {
			c.deleteService("ns", "b")
			c.setEndpoints("ns", "b", tcp8080)
		}, "ns/b", 20, nil},
		{"service added", func(c *cluster) {
			c.setService(makeService("ns", "d", "10.96.0.4", withNodePort(30004)))
			c.setEndpoints("ns", "d", tcp8080, remote("10.0.2.4"))
		}, "ns/d", 20, nil},
		{"affinity timeout changed", func(c *cluster) {
			c.setService(makeService("ns", "b", "10.96.0.2", withAffinity(200)))
		}, "ns/b", 30, nil},
		{"affinity dropped", func(c *cluster) { c.setService(makeService("ns", "b", "10.96.0.2")) }, "ns/b", 30, nil},
		{"affinity added", func(c *cluster) {
			c.setService(makeService("ns", "a", "10.96.0.1", withNodePort(30001), withExternalIPs("192.0.2.1"), withAffinity(60)))
		}, "ns/a", 40, nil}, // every element of the port goes, its chains come
		{"external policy becomes Local", func(c *cluster) {
			c.setService(makeService("ns", "a", "10.96.0.1", withNodePort(30001), withExternalIPs("192.0.2.1"), withExternalLocal()))
		}, "ns/a", 40, nil},
		{"source ranges dropped", func(c *cluster) {
			c.setService(makeService("ns", "c", "10.96.0.3", withLoadBalancer("203.0.113.3"), withExternalLocal()))
		}, "ns/c", 30, nil},
		{"local endpoint gone", func(c *cluster) { c.setEndpoints("ns", "c", tcp8080, remote("10.0.2.3")) }, "ns/c", 30, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(v1.IPv4Protocol, node)
			load(c)
			fake, w := newFake(t, baseConfig())
			syncFake(t, w, fake, c.input())

			tc.change(c)
			res := syncFake(t, w, fake, c.input())
			if res.Full || res.ServicePortsWritten > 1 {
				t.Fatalf("full=%v, %d ports written; want a partial sync of at most one", res.Full, res.ServicePortsWritten)
			}
			text := res.Transaction.String()
			for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
				if strings.HasPrefix(line, "flush ") && !strings.Contains(line, tc.service) {
					t.Errorf("partial transaction flushes a top-level object: %q", line)
				}
				// A shared chain's rules name the cluster CIDR, and
				// firewall-allow's elements a source range.
				if strings.Contains(line, "/") && !strings.Contains(line, tc.service) &&
					!strings.HasPrefix(line, "add rule ip kube-proxy lb-") && !strings.Contains(line, " firewall-allow ") {
					t.Errorf("partial transaction touches another service: %q", line)
				}
			}
			for _, line := range strings.Split(text, "\n") {
				for _, k := range tc.kept {
					if strings.Contains(line, "endpoint-") && strings.Contains(line, "__"+k) &&
						(strings.HasPrefix(line, "flush chain ") || strings.HasPrefix(line, "add rule ip kube-proxy endpoint-")) {
						t.Errorf("unchanged endpoint chain rewritten: %q", line)
					}
				}
			}
			if n := res.Transaction.NumOperations(); n > tc.wantOps {
				t.Errorf("%d operations, want at most %d:\n%s", n, tc.wantOps, text)
			}

			freshFake, fresh := newFake(t, baseConfig())
			c2 := newCluster(v1.IPv4Protocol, node)
			load(c2)
			c2.input()
			tc.change(c2)
			syncFake(t, fresh, freshFake, c2.input())
			if diff := cmp.Diff(layoutDump(freshFake), layoutDump(fake)); diff != "" {
				t.Errorf("table after the partial sync differs from a fresh full sync (-full +partial):\n%s", diff)
			}
		})
	}
}

// TestWriterPartialSyncIsConstant checks that a one-endpoint change costs
// the same number of operations whatever the number of services.
func TestWriterPartialSyncIsConstant(t *testing.T) {
	ops := map[int]int{}
	for _, n := range []int{10, 300} {
		c := newCluster(v1.IPv4Protocol, node)
		for i := range n {
			name := "svc-" + itoa(i)
			c.setService(makeService("ns", name, "10.96."+itoa(i/250)+"."+itoa(i%250+1)))
			c.setEndpoints("ns", name, tcp8080, remote("10.1."+itoa(i/250)+"."+itoa(i%250+1)))
		}
		fake, w := newFake(t, baseConfig())
		syncFake(t, w, fake, c.input())
		c.setEndpoints("ns", "svc-5", tcp8080, remote("10.1.0.6"), remote("10.2.0.6"))
		res := syncFake(t, w, fake, c.input())
		ops[n] = res.Transaction.NumOperations()
	}
	if ops[10] != ops[300] || ops[10] == 0 {
		t.Errorf("operations of a one-endpoint change by number of services: %v; want equal and non-zero", ops)
	}
}

// TestWriterFailedTransaction: after a transaction that failed, or was
// never reported, the next sync is full, lists the table and repairs it,
// including a chain deleted by hand and a chain left by an earlier run.
func TestWriterFailedTransaction(t *testing.T) {
	c := newCluster(v1.IPv4Protocol, node)
	c.setService(makeService("ns", "a", "10.96.0.1"))
	c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"))
	fake, w := newFake(t, baseConfig())
	syncFake(t, w, fake, c.input())
	want := normalDump(fake)

	// A leftover of another run, and damage by hand.
	tx := fake.NewTransaction()
	tx.Add(&knftables.Chain{Name: "service-XXXXXXXX-old/gone/tcp/p"})
	tx.Delete(&knftables.Element{Map: "service-ips", Key: []string{"10.96.0.1", "tcp", "80"}})
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}

	c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"), local("10.0.1.2"))
	res := w.Sync(context.Background(), c.input())
	if res.Full {
		t.Fatal("sync after a success was full")
	}
	w.Applied(errors.New("nft: something failed"))
	c.setEndpoints("ns", "a", tcp8080, local("10.0.1.1"))
	res = syncFake(t, w, fake, c.input())
	if !res.Full {
		t.Fatal("sync after a failure was not full")
	}
	if diff := cmp.Diff(want, normalDump(fake)); diff != "" {
		t.Errorf("full sync after the failure did not repair the table (-want +got):\n%s", diff)
	}

	// A Sync never reported counts as failed.
	w.Sync(context.Background(), c.input())
	if res := w.Sync(context.Background(), c.input()); !res.Full {
		t.Error("sync after an unreported one was not full")
	}
}

// TestWriterDataMapPartial checks the element operations of one-endpoint
// changes in the data-map layout: an endpoint that goes is replaced by the
// last one at its index, and the service's verdict moves to the shared
// chain of its new count; a replaced endpoint is one element rewritten.
func TestWriterDataMapPartial(t *testing.T) {
	for _, tc := range []struct {
		name string
		eps  []ep
		want string
	}{{
		name: "first of three goes",
		eps:  []ep{remote("10.0.2.2"), remote("10.0.2.3")},
		want: `delete element ip kube-proxy service-ips { 10.96.0.1 . tcp . 80 }
delete element ip kube-proxy endpoints { 10.96.0.1 . tcp . 80 . 0 }
delete element ip kube-proxy endpoints { 10.96.0.1 . tcp . 80 . 2 }
add element ip kube-proxy service-ips { 10.96.0.1 . tcp . 80 : goto lb-2 }
add element ip kube-proxy endpoints { 10.96.0.1 . tcp . 80 . 0 : 10.0.2.3 . 8080 }
`,
	}, {
		name: "last of three goes",
		eps:  []ep{remote("10.0.2.1"), remote("10.0.2.2")},
		want: `delete element ip kube-proxy service-ips { 10.96.0.1 . tcp . 80 }
delete element ip kube-proxy endpoints { 10.96.0.1 . tcp . 80 . 2 }
add element ip kube-proxy service-ips { 10.96.0.1 . tcp . 80 : goto lb-2 }
`,
	}, {
		name: "one replaced",
		eps:  []ep{remote("10.0.2.1"), remote("10.0.2.9"), remote("10.0.2.3")},
		want: `delete element ip kube-proxy endpoints { 10.96.0.1 . tcp . 80 . 1 }
add element ip kube-proxy endpoints { 10.96.0.1 . tcp . 80 . 1 : 10.0.2.9 . 8080 }
`,
	}, {
		name: "one added",
		eps:  []ep{remote("10.0.2.1"), remote("10.0.2.2"), remote("10.0.2.3"), remote("10.0.2.4")},
		want: `delete element ip kube-proxy service-ips { 10.96.0.1 . tcp . 80 }
add element ip kube-proxy service-ips { 10.96.0.1 . tcp . 80 : goto lb-4 }
add element ip kube-proxy endpoints { 10.96.0.1 . tcp . 80 . 3 : 10.0.2.4 . 8080 }
`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(v1.IPv4Protocol, node)
			c.setService(makeService("ns", "a", "10.96.0.1"))
			c.setEndpoints("ns", "a", tcp8080, remote("10.0.2.1"), remote("10.0.2.2"), remote("10.0.2.3"))
			// Other services hold the shared chains of 2 and 4 endpoints.
			c.setService(makeService("ns", "b", "10.96.0.2"))
			c.setEndpoints("ns", "b", tcp8080, remote("10.0.3.1"), remote("10.0.3.2"))
			c.setService(makeService("ns", "c", "10.96.0.3"))
			c.setEndpoints("ns", "c", tcp8080, remote("10.0.4.1"), remote("10.0.4.2"), remote("10.0.4.3"), remote("10.0.4.4"))
			fake, w := newFake(t, baseConfig())
			syncFake(t, w, fake, c.input())
			c.setEndpoints("ns", "a", tcp8080, tc.eps...)
			res := syncFake(t, w, fake, c.input())
			if res.Full {
				t.Fatal("sync was full")
			}
			if diff := cmp.Diff(tc.want, res.Transaction.String()); diff != "" {
				t.Errorf("transaction (-want +got):\n%s", diff)
			}
		})
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
