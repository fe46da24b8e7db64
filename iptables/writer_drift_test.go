package iptables_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
)

// findRule returns the rule of chain in table of f (the words after "-A
// CHAIN", as the Fake prints them) whose text contains substr, and its
// jump target.
func findRule(t *testing.T, f *iptablestest.Fake, table iptables.Table, chain iptables.Chain, substr string) (spec, target string) {
	t.Helper()
	var buf bytes.Buffer
	if err := f.ListRules(context.Background(), table, chain, &buf); err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(buf.String()) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "-A "+string(chain)+" ")
		if ok && strings.Contains(rest, substr) {
			_, target, _ = strings.Cut(rest, " -j ")
			target, _, _ = strings.Cut(target, " ")
			return rest, target
		}
	}
	t.Fatalf("no rule with %q in %s %s:\n%s", substr, table, chain, buf.String())
	return "", ""
}

// restoreOrFail applies one noflush restore of lines to table of f.
func restoreOrFail(t *testing.T, f *iptablestest.Fake, table iptables.Table, lines ...string) {
	t.Helper()
	data := "*" + string(table) + "\n" + strings.Join(lines, "\n") + "\nCOMMIT\n"
	if err := f.Restore(context.Background(), table, []byte(data), iptables.NoFlushTables, iptables.NoRestoreCounters); err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
}

// driftCase is a case of TestWriterCheckDrift: a way to break the rules a
// writer applied, and what CheckDrift must find.
type driftCase struct {
	name           string
	drift          func(t *testing.T, f *iptablestest.Fake)
	wantMissing    int
	wantUnexpected int
	wantExamples   []string
}

// TestWriterCheckDrift breaks the rules a writer applied in the ways an
// operator or another program would, and checks that CheckDrift names
// what it sees, that the next sync is full exactly when there is drift,
// and that after that sync the rules are whole again.
func TestWriterCheckDrift(t *testing.T) {
	webTCP := `"demo/web:tcp cluster IP"`
	for _, tc := range []driftCase{
		{
			name:  "nothing changed",
			drift: func(*testing.T, *iptablestest.Fake) {},
		},
		{
			name: "service chain and its jump deleted by hand",
			drift: func(t *testing.T, f *iptablestest.Fake) {
				spec, svc := findRule(t, f, iptables.TableNAT, iptables.KubeServicesChain, webTCP)
				restoreOrFail(t, f, iptables.TableNAT, "-D KUBE-SERVICES "+spec, ":"+svc+" - [0:0]", "-X "+svc)
			},
			// The jump, and the chain's three rules.
			wantMissing:  4,
			wantExamples: []string{`missing nat KUBE-SERVICES: "demo/web:tcp cluster IP" -j KUBE-SVC-`, "missing nat KUBE-SVC-"},
		},
		{
			name: "rule deleted inside a service chain",
			drift: func(t *testing.T, f *iptablestest.Fake) {
				_, svc := findRule(t, f, iptables.TableNAT, iptables.KubeServicesChain, webTCP)
				spec, _ := findRule(t, f, iptables.TableNAT, iptables.Chain(svc), "-j KUBE-SEP-")
				restoreOrFail(t, f, iptables.TableNAT, "-D "+svc+" "+spec)
			},
			wantMissing:  1,
			wantExamples: []string{"changed nat KUBE-SVC-"},
		},
		{
			name: "endpoint chain flushed",
			drift: func(t *testing.T, f *iptablestest.Fake) {
				_, svc := findRule(t, f, iptables.TableNAT, iptables.KubeServicesChain, webTCP)
				_, sep := findRule(t, f, iptables.TableNAT, iptables.Chain(svc), "-j KUBE-SEP-")
				restoreOrFail(t, f, iptables.TableNAT, ":"+sep+" - [0:0]")
			},
			// Its masquerade and DNAT rules.
			wantMissing:  2,
			wantExamples: []string{"changed nat KUBE-SEP-"},
		},
		{
			name: "rule added by hand to a service chain",
			drift: func(t *testing.T, f *iptablestest.Fake) {
				_, svc := findRule(t, f, iptables.TableNAT, iptables.KubeServicesChain, webTCP)
				restoreOrFail(t, f, iptables.TableNAT, "-I "+svc+" 1 -s 10.9.9.9/32 -j RETURN")
			},
			wantUnexpected: 1,
			wantExamples:   []string{"changed nat KUBE-SVC-"},
		},
		{
			name: "endpoint redirected",
			drift: func(t *testing.T, f *iptablestest.Fake) {
				_, svc := findRule(t, f, iptables.TableNAT, iptables.KubeServicesChain, webTCP)
				_, sep := findRule(t, f, iptables.TableNAT, iptables.Chain(svc), "-j KUBE-SEP-")
				spec, _ := findRule(t, f, iptables.TableNAT, iptables.Chain(sep), "-j DNAT")
				before, _, _ := strings.Cut(spec, "--to-destination")
				restoreOrFail(t, f, iptables.TableNAT, "-D "+sep+" "+spec, "-A "+sep+" "+before+"--to-destination 10.9.9.9:22")
			},
			wantMissing:    1,
			wantUnexpected: 1,
			wantExamples:   []string{"changed nat KUBE-SEP-"},
		},
		{
			name: "node-port chain flushed",
			drift: func(t *testing.T, f *iptablestest.Fake) {
				restoreOrFail(t, f, iptables.TableNAT, ":KUBE-NODEPORTS - [0:0]")
			},
			// np, local (an EXT chain) and remote each have one.
			wantMissing: 3,
		},
		{
			name: "reject rule of a service without endpoints deleted",
			drift: func(t *testing.T, f *iptablestest.Fake) {
				spec, _ := findRule(t, f, iptables.TableFilter, iptables.KubeServicesChain, `"demo/empty:tcp has no endpoints"`)
				restoreOrFail(t, f, iptables.TableFilter, "-D KUBE-SERVICES "+spec)
			},
			wantMissing:  1,
			wantExamples: []string{`missing filter KUBE-SERVICES: "demo/empty:tcp has no endpoints" -j REJECT`},
		},
		{
			name: "extra jump to a service chain",
			drift: func(t *testing.T, f *iptablestest.Fake) {
				_, svc := findRule(t, f, iptables.TableNAT, iptables.KubeServicesChain, webTCP)
				restoreOrFail(t, f, iptables.TableNAT, "-I KUBE-SERVICES 1 -d 10.1.2.3/32 -j "+svc)
			},
			wantUnexpected: 1,
			wantExamples:   []string{`unexpected nat KUBE-SERVICES: "" -j KUBE-SVC-`},
		},
		{
			name: "duplicated rule",
			drift: func(t *testing.T, f *iptablestest.Fake) {
				spec, _ := findRule(t, f, iptables.TableNAT, iptables.KubeServicesChain, webTCP)
				restoreOrFail(t, f, iptables.TableNAT, "-I KUBE-SERVICES 1 "+spec)
			},
			wantUnexpected: 1,
			wantExamples:   []string{`unexpected nat KUBE-SERVICES: "demo/web:tcp cluster IP" -j KUBE-SVC-`},
		},
		{
			name: "someone else's rule in a top-level chain",
			drift: func(t *testing.T, f *iptablestest.Fake) {
				restoreOrFail(t, f, iptables.TableNAT, "-I KUBE-SERVICES 1 -s 10.9.9.9/32 -m comment --comment other -j RETURN")
			},
		},
	} {
		for _, backend := range []iptables.Backend{iptables.BackendLegacy, iptables.BackendNFT} {
			t.Run(string(backend)+"/"+tc.name, func(t *testing.T) {
				testCheckDrift(t, backend, tc)
			})
		}
	}
}

// testCheckDrift is one case of TestWriterCheckDrift, on a Fake of
// backend: the legacy check reads nat with iptables-save, the nft one
// lists chains.
func testCheckDrift(t *testing.T, backend iptables.Backend, tc driftCase) {
	ctx := context.Background()
	c := scnCluster()
	w := mustWriter(t, scnWriterConfig(true))
	f := iptablestest.NewFake(iptablestest.WithBackend(backend))
	res := w.Sync(ctx, c.input())
	err := applyFake(f, w, res)
	w.Applied(err)
	if err != nil {
		t.Fatal(err)
	}
	want := f.Dump()

	tc.drift(t, f)
	d, err := w.CheckDrift(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	if d.Missing != tc.wantMissing || d.Unexpected != tc.wantUnexpected {
		t.Errorf("missing %d, unexpected %d; want %d, %d (examples %q)", d.Missing, d.Unexpected, tc.wantMissing, tc.wantUnexpected, d.Examples)
	}
	for _, e := range tc.wantExamples {
		if !slicesContainPrefix(d.Examples, e) {
			t.Errorf("examples %q: none starts with %q", d.Examples, e)
		}
	}

	res = w.Sync(ctx, c.input())
	if res.Full != d.Found() {
		t.Errorf("sync after the check: full %v, want %v", res.Full, d.Found())
	}
	err = applyFake(f, w, res)
	w.Applied(err)
	if err != nil {
		t.Fatal(err)
	}
	if d.Found() {
		if diff := cmp.Diff(want, f.Dump()); diff != "" {
			t.Errorf("after the full sync the rules differ from the first sync's (-want +got):\n%s", diff)
		}
		if d, err := w.CheckDrift(ctx, f); err != nil || d.Found() {
			t.Errorf("after the repair: drift %+v, error %v", d, err)
		}
	}
}

func slicesContainPrefix(list []string, prefix string) bool {
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

// countingIPT counts ListRules calls and can fail them.
type countingIPT struct {
	*iptablestest.Fake
	lists int
	err   error
}

func (c *countingIPT) ListRules(ctx context.Context, table iptables.Table, chain iptables.Chain, buf *bytes.Buffer) error {
	c.lists++
	if c.err != nil {
		return c.err
	}
	return c.Fake.ListRules(ctx, table, chain, buf)
}

// TestWriterCheckDriftWhenNotSettled checks that CheckDrift reads nothing
// while the writer's state is not what the kernel should hold (before the
// first sync, between a Sync and its Applied, after a failure): the next
// sync is full then anyway, and comparing would see drift that is not
// there. It also checks that a failing read is an error that leaves the
// next sync partial, and that a chain deleted outright is drift.
func TestWriterCheckDriftWhenNotSettled(t *testing.T) {
	ctx := context.Background()
	c := scnCluster()
	w := mustWriter(t, scnWriterConfig(true))
	ipt := &countingIPT{Fake: iptablestest.NewFake()}
	check := func(what string) iptables.Drift {
		t.Helper()
		d, err := w.CheckDrift(ctx, ipt)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return d
	}

	if d := check("before the first sync"); d.Found() || ipt.lists != 0 {
		t.Errorf("before the first sync: drift %+v after %d listings, want none and none", d, ipt.lists)
	}
	res := w.Sync(ctx, c.input())
	if d := check("before Applied"); d.Found() || ipt.lists != 0 {
		t.Errorf("before Applied: drift %+v after %d listings, want none and none", d, ipt.lists)
	}
	w.Applied(applyFake(ipt.Fake, w, res))
	if d := check("settled"); d.Found() || ipt.lists == 0 {
		t.Errorf("settled: drift %+v after %d listings, want none after some", d, ipt.lists)
	}

	ipt.err = errors.New("exec failed")
	if _, err := w.CheckDrift(ctx, ipt); err == nil {
		t.Error("a failing listing is no error")
	}
	if res := w.Sync(ctx, c.input()); res.Full {
		t.Error("a failing check made the next sync full")
	}
	w.Applied(nil)
	ipt.err = nil

	// A top-level chain gone entirely (its jumps from the built-in
	// chains first, as the kernel wants).
	if err := ipt.FlushChain(ctx, iptables.TableNAT, iptables.KubeNodePortsChain); err != nil {
		t.Fatal(err)
	}
	restoreOrFail(t, ipt.Fake, iptables.TableNAT, fmt.Sprintf(":%s - [0:0]", iptables.KubeServicesChain))
	if err := ipt.DeleteChain(ctx, iptables.TableNAT, iptables.KubeNodePortsChain); err != nil {
		t.Fatal(err)
	}
	if d := check("chain deleted"); !slicesContainPrefix(d.Examples, "missing nat KUBE-NODEPORTS: the whole chain") {
		t.Errorf("KUBE-NODEPORTS deleted: examples %q", d.Examples)
	}
	if res := w.Sync(ctx, c.input()); !res.Full {
		t.Error("after a chain was deleted the next sync is partial")
	}
}

// BenchmarkCheckDrift measures CheckDrift's own work, the listing parsed
// and compared with the writer's rules, at the benchmark sizes, against
// the Fake (whose listing costs little); TestWriterCheckDriftKernel times
// it with the real iptables.
func BenchmarkCheckDrift(b *testing.B) {
	for _, size := range benchSizes[:2] {
		b.Run(size.String(), func(b *testing.B) {
			ctx := context.Background()
			c := benchCluster(size)
			w := benchWriter(b)
			f := iptablestest.NewFake()
			res := w.Sync(ctx, c.input())
			err := applyFake(f, w, res)
			w.Applied(err)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				d, err := w.CheckDrift(ctx, f)
				if err != nil || d.Found() {
					b.Fatalf("drift %+v, error %v", d, err)
				}
			}
		})
	}
}

// BenchmarkCheckDriftLegacy is BenchmarkCheckDrift on a Fake of the
// legacy backend, where every check reads the service chains from the
// save of nat: the Go side of what TestWriterDriftRepairKernel and
// BenchmarkCheckDriftKernel time with the real iptables, the Fake's save
// included.
func BenchmarkCheckDriftLegacy(b *testing.B) {
	for _, size := range benchSizes[:2] {
		b.Run(size.String(), func(b *testing.B) {
			ctx := context.Background()
			c := benchCluster(size)
			w := benchWriter(b)
			f := iptablestest.NewFake(iptablestest.WithBackend(iptables.BackendLegacy))
			syncFake(b, w, f, c.input())
			b.ReportAllocs()
			for b.Loop() {
				d, err := w.CheckDrift(ctx, f)
				if err != nil || d.Found() {
					b.Fatalf("drift %+v, error %v", d, err)
				}
			}
		})
	}
}

// TestWriterCheckDriftChainDeleted checks, on each backend's path, that a
// top-level chain deleted outright is drift.
func TestWriterCheckDriftChainDeleted(t *testing.T) {
	for _, backend := range []iptables.Backend{iptables.BackendLegacy, iptables.BackendNFT} {
		t.Run(string(backend), func(t *testing.T) {
			ctx := context.Background()
			w := mustWriter(t, scnWriterConfig(true))
			f := iptablestest.NewFake(iptablestest.WithBackend(backend))
			err := applyFake(f, w, w.Sync(ctx, scnCluster().input()))
			w.Applied(err)
			if err != nil {
				t.Fatal(err)
			}
			restoreOrFail(t, f, iptables.TableNAT, ":KUBE-NODEPORTS - [0:0]", ":KUBE-SERVICES - [0:0]", "-X KUBE-NODEPORTS")
			d, err := w.CheckDrift(ctx, f)
			if err != nil {
				t.Fatal(err)
			}
			if !slicesContainPrefix(d.Examples, "missing nat KUBE-NODEPORTS: the whole chain") {
				t.Errorf("KUBE-NODEPORTS deleted: examples %q", d.Examples)
			}
		})
	}
}

// savingIPT counts the saves of nat.
type savingIPT struct {
	*iptablestest.Fake
	natSaves int
}

func (s *savingIPT) SaveInto(ctx context.Context, table iptables.Table, buf *bytes.Buffer) error {
	if table == iptables.TableNAT {
		s.natSaves++
	}
	return s.Fake.SaveInto(ctx, table, buf)
}

// TestWriterCheckDriftServiceChainInterval checks how often CheckDrift
// reads the service chains: with the nat save it makes anyway on legacy,
// at every check; on nft, with a save of its own in the first check and
// one in every NFTServiceChainCheckInterval after it. An endpoint chain
// flushed by hand is found within that many checks, and the sync after
// it is full.
func TestWriterCheckDriftServiceChainInterval(t *testing.T) {
	const checks = 2*iptables.NFTServiceChainCheckInterval + 1
	for _, tc := range []struct {
		backend   iptables.Backend
		wantSaves int
	}{
		{iptables.BackendLegacy, checks},
		{iptables.BackendNFT, 3},
	} {
		t.Run(string(tc.backend), func(t *testing.T) {
			ctx := context.Background()
			c := scnCluster()
			w := mustWriter(t, scnWriterConfig(true))
			ipt := &savingIPT{Fake: iptablestest.NewFake(iptablestest.WithBackend(tc.backend))}
			syncFake(t, w, ipt.Fake, c.input())
			for range checks {
				if d, err := w.CheckDrift(ctx, ipt); err != nil || d.Found() {
					t.Fatalf("drift %+v, error %v", d, err)
				}
			}
			if ipt.natSaves != tc.wantSaves {
				t.Errorf("%d checks saved nat %d times, want %d", checks, ipt.natSaves, tc.wantSaves)
			}

			_, svc := findRule(t, ipt.Fake, iptables.TableNAT, iptables.KubeServicesChain, `"demo/web:tcp cluster IP"`)
			_, sep := findRule(t, ipt.Fake, iptables.TableNAT, iptables.Chain(svc), "-j KUBE-SEP-")
			restoreOrFail(t, ipt.Fake, iptables.TableNAT, ":"+sep+" - [0:0]")
			for i := range iptables.NFTServiceChainCheckInterval {
				d, err := w.CheckDrift(ctx, ipt)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Found() {
					continue
				}
				if d.Missing != 2 || !slicesContainPrefix(d.Examples, "changed nat "+sep) {
					t.Errorf("check %d: drift %+v, want the two rules of %s missing", i+1, d, sep)
				}
				if res := syncFake(t, w, ipt.Fake, c.input()); !res.Full {
					t.Error("the sync after the drift is partial")
				}
				if got := ipt.Rules(iptables.TableNAT, iptables.Chain(sep)); len(got) != 2 {
					t.Errorf("%s after the repair: %q, want its two rules", sep, got)
				}
				return
			}
			t.Errorf("%s flushed: not found in %d checks", sep, iptables.NFTServiceChainCheckInterval)
		})
	}
}
