package iptables_test

import (
	"context"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/proxy"
)

// cluster is writertest's Cluster, whose Services and EndpointSlices go
// through the real change trackers into the maps the writer reads, under
// the names this package's tests use.
type cluster struct{ *writertest.Cluster }

func newCluster(family v1.IPFamily, node string) *cluster {
	return &cluster{writertest.NewCluster(family, node)}
}

func (c *cluster) setService(svc *v1.Service)      { c.SetService(svc) }
func (c *cluster) deleteService(ns, name string)   { c.DeleteService(ns, name) }
func (c *cluster) deleteEndpoints(ns, name string) { c.DeleteEndpoints(ns, name) }

// setEndpoints replaces the endpoints of Service ns/name (one slice named
// after it) with eps, on ports.
func (c *cluster) setEndpoints(ns, name string, ports []discoveryv1.EndpointPort, eps ...ep) {
	c.SetEndpoints(ns, name, ports, eps...)
}

// input applies the pending changes to the maps and returns the writer's
// input.
func (c *cluster) input() *proxy.FamilyInput { return c.Input() }

// The tests call writertest's builders by these short names.
type ep = writertest.Endpoint

var (
	makeService             = writertest.Service
	withPorts               = writertest.WithPorts
	withNodePort            = writertest.WithNodePort
	withExternalIPs         = writertest.WithExternalIPs
	withLoadBalancer        = writertest.WithLoadBalancer
	withHealthCheckNodePort = writertest.WithHealthCheckNodePort
	withExternalLocal       = writertest.WithExternalLocal
	withAffinity            = writertest.WithAffinity
	slicePort               = writertest.SlicePort
	tcp8080                 = writertest.TCP8080
)

func mustWriter(t testing.TB, cfg iptables.WriterConfig) *iptables.Writer {
	t.Helper()
	w, err := iptables.NewWriter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func addr(s string) netip.Addr     { return netip.MustParseAddr(s) }
func prefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// syncFake syncs w and applies the result to f, as a proxier does, and
// fails t if the restore fails.
func syncFake(t testing.TB, w *iptables.Writer, f *iptablestest.Fake, in *proxy.FamilyInput) iptables.SyncResult {
	t.Helper()
	res := w.Sync(context.Background(), in)
	err := applyFake(f, w, res)
	w.Applied(err)
	if err != nil {
		t.Fatalf("applying the %s sync:\n%s\nerror: %v", syncKind(res), res.Payload, err)
	}
	return res
}

func applyFake(f *iptablestest.Fake, w *iptables.Writer, res iptables.SyncResult) error {
	ctx := context.Background()
	if res.Full {
		if err := w.EnsureJumpRules(ctx, f); err != nil {
			return err
		}
	}
	if len(res.Payload) == 0 {
		return nil
	}
	return f.RestoreAll(ctx, res.Payload, iptables.NoFlushTables, iptables.RestoreCounters)
}

func syncKind(res iptables.SyncResult) string {
	if res.Full {
		return "full"
	}
	return "partial"
}
