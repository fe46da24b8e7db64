package nftables_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/nftables/nftablestest"
	"github.com/proxykit/proxykit/proxy"
)

// cluster is writertest's Cluster, whose Services and EndpointSlices go
// through the real change trackers into the maps the writer reads, under
// the names this package's tests use.
type cluster struct{ *writertest.Cluster }

func newCluster(family v1.IPFamily, node string) *cluster {
	return &cluster{writertest.NewCluster(family, node)}
}

func (c *cluster) setService(svc *v1.Service)    { c.SetService(svc) }
func (c *cluster) deleteService(ns, name string) { c.DeleteService(ns, name) }

// setEndpoints replaces the endpoints of Service ns/name (one slice named
// after it) with eps, on ports.
func (c *cluster) setEndpoints(ns, name string, ports []discoveryv1.EndpointPort, eps ...ep) {
	c.SetEndpoints(ns, name, ports, eps...)
}

// input applies the pending changes to the maps and returns the writer's
// input.
func (c *cluster) input() *proxy.FamilyInput { return c.Input() }

// The tests call writertest's builders by these short names (all but
// withExternalLocal, which differs below).
type (
	svcOpt = writertest.ServiceOption
	ep     = writertest.Endpoint
)

var (
	makeService      = writertest.Service
	withPorts        = writertest.WithPorts
	withNodePort     = writertest.WithNodePort
	withExternalIPs  = writertest.WithExternalIPs
	withLoadBalancer = writertest.WithLoadBalancer
	withAffinity     = writertest.WithAffinity
	slicePort        = writertest.SlicePort
	makeSlice        = writertest.Slice
	tcp8080          = writertest.TCP8080
)

// withExternalLocal sets externalTrafficPolicy Local, with the health
// check node port the API server would allocate.
func withExternalLocal() svcOpt {
	return func(s *v1.Service) {
		writertest.WithExternalLocal()(s)
		writertest.WithHealthCheckNodePort(32000)(s)
	}
}

func addr(s string) netip.Addr     { return netip.MustParseAddr(s) }
func prefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func nftFamily(f v1.IPFamily) knftables.Family {
	if f == v1.IPv6Protocol {
		return knftables.IPv6Family
	}
	return knftables.IPv4Family
}

// newFake returns a Fake for the writer's default table of family and a
// writer for cfg on it.
func newFake(t testing.TB, cfg nftables.WriterConfig) (*knftables.Fake, *nftables.Writer) {
	t.Helper()
	table := cfg.TableName
	if table == "" {
		table = nftables.DefaultTableName
	}
	fake := knftables.NewFake(nftFamily(cfg.Family), table)
	w, err := nftables.NewWriter(fake, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return fake, w
}

// syncFake syncs w and runs the transaction on fake, as a proxier does,
// after checking it against what the kernel refuses and the Fake does not;
// it fails t if either fails.
func syncFake(t testing.TB, w *nftables.Writer, fake *knftables.Fake, in *proxy.FamilyInput) nftables.SyncResult {
	t.Helper()
	return syncFakeCtx(t, context.Background(), w, fake, in)
}

// syncFakeCtx is syncFake with ctx (and its logger) for the sync.
func syncFakeCtx(t testing.TB, ctx context.Context, w *nftables.Writer, fake *knftables.Fake, in *proxy.FamilyInput) nftables.SyncResult {
	t.Helper()
	res := w.Sync(ctx, in)
	err := nftablestest.CheckTransaction(fake, res.Transaction)
	if err == nil {
		err = fake.Run(context.Background(), res.Transaction)
	}
	w.Applied(err)
	if err != nil {
		t.Fatalf("running the sync (full %v):\n%s\nerror: %v", res.Full, res.Transaction, err)
	}
	return res
}

// normalDump is fake's Dump with the elements of each set and map sorted:
// their order means nothing to nft, and a partial sync appends where a
// full sync writes in name order.
func normalDump(fake *knftables.Fake) string {
	return strings.Join(sortElementRuns(strings.Split(fake.Dump(), "\n")), "\n")
}

// sortElementRuns sorts each run of element lines in lines.
func sortElementRuns(lines []string) []string {
	start := -1
	for i := 0; i <= len(lines); i++ {
		isElem := i < len(lines) && strings.HasPrefix(lines[i], "add element ")
		if isElem && start < 0 {
			start = i
		}
		if !isElem && start >= 0 {
			slices.Sort(lines[start:i])
			start = -1
		}
	}
	return lines
}

// layoutDump is normalDump for comparing a table after partial syncs with
// a fresh full sync's: an endpoint's index in the endpoints maps depends
// on the syncs before (a partial sync moves the last endpoint into a freed
// index), so indexes become "#" once checked to run from 0 without gaps
// for every service key (a line says so if not), and shared chains that no
// element points at, which partial syncs keep, are left out.
func layoutDump(fake *knftables.Fake) string {
	lines := strings.Split(normalDump(fake), "\n")
	used := map[string]bool{}
	for _, l := range lines {
		if strings.HasPrefix(l, "add element ") {
			f := strings.Fields(l)
			for i := range f[:len(f)-1] {
				if f[i] == "goto" {
					used[strings.TrimSuffix(f[i+1], ",")] = true
				}
			}
		}
	}
	indexes := map[string][]int{}
	var out []string
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) > 4 && (f[1] == "chain" || f[1] == "rule") && strings.HasPrefix(f[4], "lb-") && !used[f[4]] {
			continue
		}
		if len(f) > 4 && f[1] == "element" && (f[4] == "endpoints" || f[4] == "nodeport-endpoints") {
			key, value, _ := strings.Cut(l[strings.Index(l, "{")+2:], " : ")
			parts := strings.Split(key, " . ")
			n, _ := strconv.Atoi(parts[len(parts)-1])
			svc := f[4] + " " + strings.Join(parts[:len(parts)-1], " . ")
			indexes[svc] = append(indexes[svc], n)
			l = "add element " + svc + " . # : " + value
		}
		out = append(out, l)
	}
	out = sortElementRuns(out)
	for svc, idx := range indexes {
		slices.Sort(idx)
		for i, n := range idx {
			if i != n {
				out = append(out, fmt.Sprintf("indexes of %s are %v, not 0..%d", svc, idx, len(idx)-1))
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
