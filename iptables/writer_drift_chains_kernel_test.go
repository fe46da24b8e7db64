package iptables_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/iptables"
)

// kernelWriter syncs c into the namespace of ipt with the real
// iptables-restore of backend and returns the writer, settled.
func kernelWriter(t testing.TB, ipt *nsIPT, backend iptables.Backend, c *cluster) *iptables.Writer {
	t.Helper()
	cfg := scnWriterConfig(ipt.ipt.HasRandomFully())
	if backend == iptables.BackendNFT {
		cfg.ChainsPerCommit = iptables.NFTChainsPerCommit
	}
	w := mustWriter(t, cfg)
	kernelSync(t, ipt, w, c)
	return w
}

// kernelSync syncs c with w into the namespace of ipt, as a proxier
// does, and fails t if the restore fails.
func kernelSync(t testing.TB, ipt *nsIPT, w *iptables.Writer, c *cluster) iptables.SyncResult {
	t.Helper()
	ctx := context.Background()
	res := w.Sync(ctx, c.input())
	err := ipt.do(func(i iptables.Interface) error {
		if res.Full {
			if err := w.EnsureJumpRules(ctx, i); err != nil {
				return err
			}
		}
		return i.RestoreAll(ctx, res.Payload, iptables.NoFlushTables, iptables.RestoreCounters)
	})
	w.Applied(err)
	if err != nil {
		t.Fatalf("%s sync: %v", syncKind(res), err)
	}
	return res
}

// TestWriterDriftRepairKernel breaks, by hand, the per-service and
// per-endpoint chains that a writer applied with the real
// iptables-restore of each backend, in a throwaway namespace: a rule
// deleted inside a KUBE-SVC chain, a KUBE-SEP chain flushed, a rule added
// to a KUBE-SVC chain. Writer.CheckDrift must find each within the number
// of checks its godoc promises (one on legacy,
// NFTServiceChainCheckInterval on nft), and the full sync it brings must give
// back the nat table as first applied. Before that, checks over the
// rules as applied (services of every kind: node ports, load balancers
// with source ranges, externalTrafficPolicy Local, affinity) must find
// nothing. It logs the checks and the time from the edit to the repair
// (go test -v); nothing runs with -short.
func TestWriterDriftRepairKernel(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping kernel drift repair in -short mode")
	}
	for _, backend := range []iptables.Backend{iptables.BackendLegacy, iptables.BackendNFT} {
		t.Run(string(backend), func(t *testing.T) {
			kerneltest.Require(t, kernelTools(backend)...)
			testDriftRepairKernel(t, backend)
		})
	}
}

func testDriftRepairKernel(t *testing.T, backend iptables.Backend) {
	ctx := context.Background()
	ns := kerneltest.NewNS(t)
	ipt := newNSIPT(t, ns, backend, v1.IPv4Protocol)
	c := scnCluster()
	c.LoadBench(100, 10)
	w := kernelWriter(t, ipt, backend, c)
	natSave := func() string {
		t.Helper()
		var buf bytes.Buffer
		ipt.must(func(i iptables.Interface) error { return i.SaveInto(ctx, iptables.TableNAT, &buf) })
		return string(stripCounters(buf.Bytes()))
	}
	want := natSave()
	chains := 0
	for _, ch := range iptables.ChainsFromSave([]byte(want)) {
		if kubeChains.IsServiceChain(ch) {
			chains++
		}
	}
	bound := 1
	if backend == iptables.BackendNFT {
		bound = iptables.NFTServiceChainCheckInterval
	}
	check := func() iptables.Drift {
		t.Helper()
		var d iptables.Drift
		ipt.must(func(i iptables.Interface) (err error) {
			d, err = w.CheckDrift(ctx, i)
			return err
		})
		return d
	}
	for range bound {
		if d := check(); d.Found() {
			t.Fatalf("drift in the rules as applied: %+v", d)
		}
	}

	svc := kubeChains.ServiceCluster(portName("bench", "svc-1", "p", v1.ProtocolTCP))
	var jump []string
	var sep iptables.Chain
	var buf bytes.Buffer
	ipt.must(func(i iptables.Interface) error { return i.ListRules(ctx, iptables.TableNAT, svc, &buf) })
	for line := range strings.Lines(buf.String()) {
		words := strings.Fields(line)
		if len(words) > 2 && strings.Contains(words[len(words)-1], "-SEP-") {
			jump, sep = unquote(words[2:]), iptables.Chain(words[len(words)-1])
			break
		}
	}
	if jump == nil {
		t.Fatalf("no jump to an endpoint chain in %s:\n%s", svc, buf.String())
	}
	for _, tc := range []struct {
		name string
		edit func(i iptables.Interface) error
	}{
		{"rule deleted in a KUBE-SVC chain", func(i iptables.Interface) error {
			return i.DeleteRule(ctx, iptables.TableNAT, svc, jump...)
		}},
		{"KUBE-SEP chain flushed", func(i iptables.Interface) error {
			return i.FlushChain(ctx, iptables.TableNAT, sep)
		}},
		{"rule added to a KUBE-SVC chain", func(i iptables.Interface) error {
			_, err := i.EnsureRule(ctx, iptables.Prepend, iptables.TableNAT, svc, "-s", "10.9.9.9/32", "-j", "RETURN")
			return err
		}},
	} {
		ipt.must(tc.edit)
		start := time.Now()
		var d iptables.Drift
		checks := 0
		for checks < bound && !d.Found() {
			d = check()
			checks++
		}
		if !d.Found() {
			t.Errorf("%s: no drift found in %d checks", tc.name, checks)
			continue
		}
		found := time.Since(start)
		if res := kernelSync(t, ipt, w, c); !res.Full {
			t.Errorf("%s: the sync after the drift is partial", tc.name)
		}
		repaired := time.Since(start)
		if diff := cmp.Diff(want, natSave()); diff != "" {
			t.Errorf("%s: nat after the repair (-want +got):\n%s", tc.name, diff)
		}
		t.Logf("%s %s: found by check %d of at most %d (%d service chains) after %v; repaired after %v (%+v)",
			backend, tc.name, checks, bound, chains, found.Round(time.Millisecond), repaired.Round(time.Millisecond), d)
	}
}

// BenchmarkCheckDriftKernel measures one Writer.CheckDrift, top-level and
// service chains, against the real iptables of each backend in a
// throwaway namespace loaded with a benchmark cluster. 1000x10 runs
// always; 10000x10 only with PROXYKIT_RESTORE_BENCH=1 (loading it takes
// tens of seconds). On nft, where one check in
// NFTServiceChainCheckInterval also reads the service chains, it reports
// the two kinds of check apart: "top-ns/check" for a check of the
// top-level chains alone, "save-ns/check" for one that saves nat too;
// "nat-save-ns" is, for comparison, one iptables-save of nat alone.
func BenchmarkCheckDriftKernel(b *testing.B) {
	sizes := benchSizes[:1]
	if os.Getenv(restoreBenchEnv) == "1" {
		sizes = benchSizes[:2]
	}
	for _, backend := range []iptables.Backend{iptables.BackendLegacy, iptables.BackendNFT} {
		for _, size := range sizes {
			b.Run(fmt.Sprintf("%s/%s", backend, size), func(b *testing.B) {
				kerneltest.Require(b, kernelTools(backend)...)
				ctx := context.Background()
				ns := kerneltest.NewNS(b)
				ipt := newNSIPT(b, ns, backend, v1.IPv4Protocol)
				c := benchCluster(size)
				w := kernelWriter(b, ipt, backend, c)
				var top, save time.Duration
				var tops, saves int
				b.ReportAllocs()
				for b.Loop() {
					start := time.Now()
					ipt.must(func(i iptables.Interface) error {
						d, err := w.CheckDrift(ctx, i)
						if err == nil && d.Found() {
							err = fmt.Errorf("drift in the rules as applied: %+v", d)
						}
						return err
					})
					if n := tops + saves; backend == iptables.BackendLegacy || n%iptables.NFTServiceChainCheckInterval == 0 {
						save += time.Since(start)
						saves++
					} else {
						top += time.Since(start)
						tops++
					}
				}
				if tops > 0 {
					b.ReportMetric(float64(top.Nanoseconds())/float64(tops), "top-ns/check")
				}
				b.ReportMetric(float64(save.Nanoseconds())/float64(saves), "save-ns/check")
				// For comparison, iptables-save of nat alone.
				b.StopTimer()
				start := time.Now()
				var buf bytes.Buffer
				ipt.must(func(i iptables.Interface) error { return i.SaveInto(ctx, iptables.TableNAT, &buf) })
				b.ReportMetric(float64(time.Since(start).Nanoseconds()), "nat-save-ns")
			})
		}
	}
}
