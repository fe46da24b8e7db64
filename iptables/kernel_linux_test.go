package iptables_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
)

// These tests run the real binaries of both backends inside throwaway
// network namespaces. Every call of the Interface runs inside ns.Do, so
// that the commands it execs live in the namespace.

var backends = []iptables.Backend{iptables.BackendLegacy, iptables.BackendNFT}

func requireKernel(t *testing.T) {
	t.Helper()
	var tools []string
	for _, b := range backends {
		for _, base := range []string{"iptables", "ip6tables"} {
			for _, s := range []string{"", "-save", "-restore"} {
				tools = append(tools, base+"-"+string(b)+s)
			}
		}
	}
	kerneltest.Require(t, tools...)
}

// nsIPT is an Interface whose calls run in a namespace.
type nsIPT struct {
	t   testing.TB
	ns  *kerneltest.NS
	ipt iptables.Interface
}

// newNSIPT makes an Interface for the namespace. Unless opts say
// otherwise, it uses the namespace's own xtables lock (lockFile(ns)):
// legacy tables are per namespace, and other tests on the machine may hold
// the host's lock for seconds.
func newNSIPT(t testing.TB, ns *kerneltest.NS, backend iptables.Backend, p v1.IPFamily, opts ...iptables.Option) *nsIPT {
	t.Helper()
	n := &nsIPT{t: t, ns: ns}
	t.Cleanup(func() { os.Remove(lockFile(ns)) })
	opts = append([]iptables.Option{iptables.WithBackend(backend), iptables.WithLockFile(lockFile(ns))}, opts...)
	err := ns.Do(func() (err error) {
		n.ipt, err = iptables.New(context.Background(), p, opts...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// lockFile returns the xtables lock file the tests use for ns.
func lockFile(ns *kerneltest.NS) string {
	return os.TempDir() + "/proxykit-xtables-" + ns.Name + ".lock"
}

// execIn runs an iptables binary in ns with the namespace's lock, and
// fails t on error.
func execIn(t *testing.T, ns *kerneltest.NS, binary string, args ...string) string {
	t.Helper()
	t.Cleanup(func() { os.Remove(lockFile(ns)) })
	return ns.MustExec(t, "env", append([]string{"XTABLES_LOCKFILE=" + lockFile(ns), binary}, args...)...)
}

// do runs fn in the namespace.
func (n *nsIPT) do(fn func(ipt iptables.Interface) error) error {
	return n.ns.Do(func() error { return fn(n.ipt) })
}

// must runs fn in the namespace and fails the test on error.
func (n *nsIPT) must(fn func(ipt iptables.Interface) error) {
	n.t.Helper()
	if err := n.do(fn); err != nil {
		n.t.Fatal(err)
	}
}

// save returns SaveInto's output for table without comments and counters.
func (n *nsIPT) save(table iptables.Table) string {
	n.t.Helper()
	var buf bytes.Buffer
	n.must(func(ipt iptables.Interface) error { return ipt.SaveInto(context.Background(), table, &buf) })
	return normalizeSave(buf.String())
}

func normalizeSave(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, ":") {
			if i := strings.LastIndex(line, " ["); i >= 0 {
				line = line[:i] + " [0:0]"
			}
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// ruleset returns restore input for services with endpoints each, in the
// nat and filter tables, for family p.
func ruleset(p v1.IPFamily, services, endpoints int) []byte {
	addr := func(a, b int) string {
		if p == v1.IPv6Protocol {
			return fmt.Sprintf("fd00:%x::%x", a, b)
		}
		return fmt.Sprintf("10.%d.%d.%d", a, b/256, b%256)
	}
	b := iptables.NewLineBuffer()
	b.Write("*filter")
	b.Write(":KUBE-SERVICES", "-", "[0:0]")
	b.Write("-A", "INPUT", "-m", "conntrack", "--ctstate", "NEW", "-j", "KUBE-SERVICES")
	b.Write("-A", "KUBE-SERVICES", "-d", addr(96, 999), "-p", "tcp", "--dport", "80", "-j", "REJECT")
	b.Write("COMMIT")
	b.Write("*nat")
	b.Write(":KUBE-SERVICES", "-", "[0:0]")
	for s := 0; s < services; s++ {
		b.Write(fmt.Sprintf(":KUBE-SVC-%d", s), "-", "[0:0]")
		for e := 0; e < endpoints; e++ {
			b.Write(fmt.Sprintf(":KUBE-SEP-%d-%d", s, e), "-", "[0:0]")
		}
	}
	b.Write("-A", "PREROUTING", "-j", "KUBE-SERVICES")
	for s := 0; s < services; s++ {
		svc := fmt.Sprintf("KUBE-SVC-%d", s)
		b.Write("-A", "KUBE-SERVICES", "-d", addr(96, s), "-p", "tcp", "-m", "comment", "--comment", `"ns/svc:http"`, "--dport", "80", "-j", svc)
		for e := 0; e < endpoints; e++ {
			sep := fmt.Sprintf("KUBE-SEP-%d-%d", s, e)
			if e < endpoints-1 {
				b.Write("-A", svc, "-m", "statistic", "--mode", "random", "--probability", fmt.Sprintf("%.11f", 1/float64(endpoints-e)), "-j", sep)
			} else {
				b.Write("-A", svc, "-j", sep)
			}
			ep := addr(244, s*endpoints+e)
			if p == v1.IPv6Protocol {
				ep = "[" + ep + "]"
			}
			b.Write("-A", sep, "-p", "tcp", "-j", "DNAT", "--to-destination", ep+":8080")
		}
	}
	b.Write("COMMIT")
	return append([]byte(nil), b.Bytes()...)
}

func forEachBackend(t *testing.T, fn func(t *testing.T, backend iptables.Backend, p v1.IPFamily)) {
	requireKernel(t)
	for _, backend := range backends {
		for _, p := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			t.Run(fmt.Sprintf("%s/%s", backend, p), func(t *testing.T) { fn(t, backend, p) })
		}
	}
}

func newFake(backend iptables.Backend, p v1.IPFamily) *iptablestest.Fake {
	if p == v1.IPv6Protocol {
		return iptablestest.NewIPv6Fake(iptablestest.WithBackend(backend))
	}
	return iptablestest.NewFake(iptablestest.WithBackend(backend))
}

// TestKernelRestoreAndSave restores a generated ruleset, reads it back
// with SaveInto, changes one chain with a --noflush restore, and checks
// that every state equals the Fake's after the same operations.
func TestKernelRestoreAndSave(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend iptables.Backend, p v1.IPFamily) {
		ctx := context.Background()
		n := newNSIPT(t, kerneltest.NewNS(t), backend, p)
		fake := newFake(backend, p)
		compare := func(step string) {
			t.Helper()
			for _, table := range []iptables.Table{iptables.TableNAT, iptables.TableFilter} {
				var want bytes.Buffer
				if err := fake.SaveInto(ctx, table, &want); err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(want.String(), n.save(table)); diff != "" {
					t.Errorf("%s: table %s differs from the Fake's (-fake +kernel):\n%s", step, table, diff)
				}
			}
		}
		full := ruleset(p, 20, 3)
		n.must(func(ipt iptables.Interface) error {
			return ipt.RestoreAll(ctx, full, iptables.FlushTables, iptables.NoRestoreCounters)
		})
		if err := fake.RestoreAll(ctx, full, iptables.FlushTables, iptables.NoRestoreCounters); err != nil {
			t.Fatal(err)
		}
		compare("full restore")
		if got := strings.Count(n.save(iptables.TableNAT), "\n-A "); got != 1+20+20*3*2 {
			t.Errorf("nat holds %d rules, want %d", got, 1+20+20*3*2)
		}

		before := n.save(iptables.TableNAT)
		partial := []byte("*nat\n:KUBE-SVC-3 - [0:0]\n-A KUBE-SVC-3 -j KUBE-SEP-3-1\nCOMMIT\n")
		n.must(func(ipt iptables.Interface) error {
			return ipt.Restore(ctx, iptables.TableNAT, partial, iptables.NoFlushTables, iptables.RestoreCounters)
		})
		if err := fake.Restore(ctx, iptables.TableNAT, partial, iptables.NoFlushTables, iptables.RestoreCounters); err != nil {
			t.Fatal(err)
		}
		compare("partial restore")
		after := n.save(iptables.TableNAT)
		var removed, added []string
		for _, line := range strings.Split(before, "\n") {
			if !strings.Contains(after, line+"\n") {
				removed = append(removed, line)
			}
		}
		for _, line := range strings.Split(after, "\n") {
			if !strings.Contains(before, line+"\n") {
				added = append(added, line)
			}
		}
		if len(added) != 1 || !strings.HasPrefix(added[0], "-A KUBE-SVC-3 ") || len(removed) != 3 {
			t.Errorf("the --noflush restore changed more than KUBE-SVC-3: removed %q, added %q", removed, added)
		}
	})
}

// TestKernelRestoreFailure checks that an invalid rule fails the restore
// with the line iptables-restore blamed, and leaves the rules as they were.
func TestKernelRestoreFailure(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend iptables.Backend, p v1.IPFamily) {
		ctx := context.Background()
		n := newNSIPT(t, kerneltest.NewNS(t), backend, p)
		n.must(func(ipt iptables.Interface) error {
			return ipt.RestoreAll(ctx, ruleset(p, 5, 2), iptables.FlushTables, iptables.NoRestoreCounters)
		})
		before := n.save(iptables.TableNAT)
		bad := []byte("*nat\n:KUBE-SVC-1 - [0:0]\n-A KUBE-SVC-1 -j KUBE-SEP-1-0\n-A KUBE-SVC-1 --bogus -j KUBE-SEP-1-1\nCOMMIT\n")
		err := n.do(func(ipt iptables.Interface) error {
			return ipt.RestoreAll(ctx, bad, iptables.NoFlushTables, iptables.NoRestoreCounters)
		})
		var e *iptables.Error
		if !errors.As(err, &e) || e.Line != 4 || e.ExitStatus != 2 || !strings.Contains(e.Stderr, `unknown option "--bogus"`) {
			t.Fatalf("got %v, want an *iptables.Error for line 4 with exit status 2", err)
		}
		fake := newFake(backend, p)
		if err := fake.RestoreAll(ctx, ruleset(p, 5, 2), iptables.FlushTables, iptables.NoRestoreCounters); err != nil {
			t.Fatal(err)
		}
		fakeErr := fake.RestoreAll(ctx, bad, iptables.NoFlushTables, iptables.NoRestoreCounters)
		if !errors.As(fakeErr, &e) || e.Line != 4 || e.ExitStatus != 2 {
			t.Errorf("the Fake reports %v for the same input", fakeErr)
		}
		if diff := cmp.Diff(before, n.save(iptables.TableNAT)); diff != "" {
			t.Errorf("a failed restore changed the rules (-before +after):\n%s", diff)
		}
	})
}

// TestKernelEnsureAndDelete checks the single-command methods, and that
// EnsureRule and DeleteRule are idempotent.
func TestKernelEnsureAndDelete(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend iptables.Backend, p v1.IPFamily) {
		ctx := context.Background()
		n := newNSIPT(t, kerneltest.NewNS(t), backend, p)
		const chain = iptables.Chain("PROXYKIT-TEST")
		src := "10.1.2.3"
		if p == v1.IPv6Protocol {
			src = "fd00::3"
		}
		rule := []string{"-s", src, "-p", "tcp", "--dport", "80", "-m", "comment", "--comment", "a test rule", "-j", "ACCEPT"}
		type step struct {
			name  string
			do    func(ipt iptables.Interface) (any, error)
			want  any
			check func(error) bool
		}
		steps := []step{
			{"Present", func(ipt iptables.Interface) (any, error) { return nil, ipt.Present(ctx) }, nil, nil},
			{"ChainExists before", func(ipt iptables.Interface) (any, error) { return ipt.ChainExists(ctx, iptables.TableFilter, chain) }, false, nil},
			{"FlushChain of a missing chain", func(ipt iptables.Interface) (any, error) {
				return nil, ipt.FlushChain(ctx, iptables.TableFilter, chain)
			}, nil, iptables.IsNotFound},
			{"DeleteChain of a missing chain", func(ipt iptables.Interface) (any, error) {
				return nil, ipt.DeleteChain(ctx, iptables.TableFilter, chain)
			}, nil, iptables.IsNotFound},
			{"EnsureChain", func(ipt iptables.Interface) (any, error) { return ipt.EnsureChain(ctx, iptables.TableFilter, chain) }, false, nil},
			{"EnsureChain again", func(ipt iptables.Interface) (any, error) { return ipt.EnsureChain(ctx, iptables.TableFilter, chain) }, true, nil},
			{"ChainExists", func(ipt iptables.Interface) (any, error) { return ipt.ChainExists(ctx, iptables.TableFilter, chain) }, true, nil},
			{"EnsureRule", func(ipt iptables.Interface) (any, error) {
				return ipt.EnsureRule(ctx, iptables.Append, iptables.TableFilter, chain, rule...)
			}, false, nil},
			{"EnsureRule again", func(ipt iptables.Interface) (any, error) {
				return ipt.EnsureRule(ctx, iptables.Prepend, iptables.TableFilter, chain, rule...)
			}, true, nil},
			{"RuleExists", func(ipt iptables.Interface) (any, error) {
				return ipt.RuleExists(ctx, iptables.TableFilter, chain, rule...)
			}, true, nil},
			{"EnsureRule jumping", func(ipt iptables.Interface) (any, error) {
				return ipt.EnsureRule(ctx, iptables.Prepend, iptables.TableFilter, iptables.ChainInput, "-j", string(chain))
			}, false, nil},
			{"DeleteChain of a referenced chain", func(ipt iptables.Interface) (any, error) {
				return nil, ipt.DeleteChain(ctx, iptables.TableFilter, chain)
			}, nil, func(err error) bool { return err != nil && !iptables.IsNotFound(err) }},
			{"DeleteRule", func(ipt iptables.Interface) (any, error) {
				return nil, ipt.DeleteRule(ctx, iptables.TableFilter, chain, rule...)
			}, nil, nil},
			{"DeleteRule again", func(ipt iptables.Interface) (any, error) {
				return nil, ipt.DeleteRule(ctx, iptables.TableFilter, chain, rule...)
			}, nil, nil},
			{"RuleExists after", func(ipt iptables.Interface) (any, error) {
				return ipt.RuleExists(ctx, iptables.TableFilter, chain, rule...)
			}, false, nil},
			{"DeleteRule jumping", func(ipt iptables.Interface) (any, error) {
				return nil, ipt.DeleteRule(ctx, iptables.TableFilter, iptables.ChainInput, "-j", string(chain))
			}, nil, nil},
			{"FlushChain", func(ipt iptables.Interface) (any, error) {
				return nil, ipt.FlushChain(ctx, iptables.TableFilter, chain)
			}, nil, nil},
			{"DeleteChain", func(ipt iptables.Interface) (any, error) {
				return nil, ipt.DeleteChain(ctx, iptables.TableFilter, chain)
			}, nil, nil},
			{"ChainExists after", func(ipt iptables.Interface) (any, error) { return ipt.ChainExists(ctx, iptables.TableFilter, chain) }, false, nil},
			{"DeleteRule in a missing chain", func(ipt iptables.Interface) (any, error) {
				return nil, ipt.DeleteRule(ctx, iptables.TableFilter, chain, rule...)
			}, nil, nil},
			{"RuleExists jumping to a missing chain", func(ipt iptables.Interface) (any, error) {
				return ipt.RuleExists(ctx, iptables.TableFilter, iptables.ChainInput, "-j", string(chain))
			}, false, nil},
			{"DeleteRule jumping to a missing chain", func(ipt iptables.Interface) (any, error) {
				return nil, ipt.DeleteRule(ctx, iptables.TableFilter, iptables.ChainInput, "-j", string(chain))
			}, nil, nil},
			{"EnsureRule jumping to a missing chain", func(ipt iptables.Interface) (any, error) {
				return ipt.EnsureRule(ctx, iptables.Append, iptables.TableFilter, iptables.ChainInput, "-j", string(chain))
			}, false, func(err error) bool { return err != nil }},
		}
		fake := newFake(backend, p)
		for _, s := range steps {
			var got any
			err := n.do(func(ipt iptables.Interface) (err error) { got, err = s.do(ipt); return err })
			if s.check == nil && err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			if s.check != nil && !s.check(err) {
				t.Fatalf("%s: error %v is not the one expected", s.name, err)
			}
			if s.want != nil && got != s.want {
				t.Fatalf("%s: got %v, want %v", s.name, got, s.want)
			}
			// The Fake behaves the same.
			fakeGot, fakeErr := s.do(fake)
			if (fakeErr == nil) != (err == nil) || (s.check != nil && !s.check(fakeErr)) || (s.want != nil && fakeGot != s.want) {
				t.Errorf("%s: the Fake gives %v, %v; the kernel %v, %v", s.name, fakeGot, fakeErr, got, err)
			}
		}
		var v iptables.Version
		n.must(func(ipt iptables.Interface) error { v = ipt.Version(); return nil })
		if !v.AtLeast(iptables.Version{Major: 1, Minor: 6, Patch: 2}) || !n.ipt.HasRandomFully() || n.ipt.Backend() != backend || n.ipt.Family() != p {
			t.Errorf("version %v, random-fully %v, backend %v, protocol %v", v, n.ipt.HasRandomFully(), n.ipt.Backend(), n.ipt.Family())
		}
	})
}

// TestKernelMonitor checks that Monitor calls its reload function after
// the real iptables binary flushes or deletes the canaries, and recreates
// them.
func TestKernelMonitor(t *testing.T) {
	requireKernel(t)
	tables := []iptables.Table{iptables.TableMangle, iptables.TableNAT, iptables.TableFilter}
	const canary = iptables.Chain("PROXYKIT-CANARY")
	for _, backend := range backends {
		for _, tc := range []struct {
			name    string
			disturb [][]string
		}{
			{name: "iptables -F of one table", disturb: [][]string{{"-t", "filter", "-F"}}},
			{name: "iptables -F and -X of every table", disturb: [][]string{
				{"-t", "mangle", "-F"}, {"-t", "mangle", "-X"}, {"-t", "nat", "-F"}, {"-t", "nat", "-X"}, {"-t", "filter", "-F"}, {"-t", "filter", "-X"},
			}},
		} {
			t.Run(string(backend)+"/"+tc.name, func(t *testing.T) {
				ns := kerneltest.NewNS(t)
				n := newNSIPT(t, ns, backend, v1.IPv4Protocol)
				ctx, cancel := context.WithCancel(context.Background())
				reloads := make(chan struct{}, 10)
				done := make(chan error)
				go func() {
					done <- n.do(func(ipt iptables.Interface) error {
						ipt.Monitor(ctx, canary, tables, func() { reloads <- struct{}{} }, 100*time.Millisecond)
						return nil
					})
				}()
				defer func() {
					cancel()
					if err := <-done; err != nil {
						t.Error(err)
					}
				}()
				binary := "iptables-" + string(backend)
				canariesIn := func() int {
					count := 0
					for _, table := range tables {
						out, err := ns.Exec("env", "XTABLES_LOCKFILE="+lockFile(ns), binary, "-w", "-t", string(table), "-S", string(canary))
						if err == nil && strings.Contains(out, "-A "+string(canary)+" -j RETURN") {
							count++
						}
					}
					return count
				}
				waitFor := func(what string, cond func() bool) {
					t.Helper()
					deadline := time.Now().Add(15 * time.Second)
					for !cond() {
						if time.Now().After(deadline) {
							t.Fatalf("timed out waiting for %s", what)
						}
						time.Sleep(20 * time.Millisecond)
					}
				}
				waitFor("the canaries", func() bool { return canariesIn() == len(tables) })
				select {
				case <-reloads:
					t.Fatal("reloadFunc called before anything happened")
				default:
				}
				for _, args := range tc.disturb {
					execIn(t, ns, binary, args...)
				}
				select {
				case <-reloads:
				case <-time.After(15 * time.Second):
					t.Fatal("reloadFunc not called after the canaries were flushed")
				}
				waitFor("the canaries to be recreated", func() bool { return canariesIn() == len(tables) })
			})
		}
	}
}

// TestKernelXtablesLock holds the xtables lock while a legacy iptables
// command runs: with the wait flag it waits and succeeds once the lock is
// released; with a short wait it fails with a lock timeout. The lock is
// the host's default /run/xtables.lock (a file, not a network object),
// held for at most a second or two.
func TestKernelXtablesLock(t *testing.T) {
	requireKernel(t)
	ctx := context.Background()
	ns := kerneltest.NewNS(t)
	hold := func() func() {
		t.Helper()
		f, err := os.OpenFile("/run/xtables.lock", os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			t.Fatal(err)
		}
		return func() { f.Close() }
	}

	for _, tc := range []struct {
		name string
		op   func(ipt iptables.Interface) error
	}{
		{name: "iptables", op: func(ipt iptables.Interface) error {
			_, err := ipt.EnsureChain(ctx, iptables.TableFilter, "PROXYKIT-LOCK")
			return err
		}},
		{name: "iptables-restore", op: func(ipt iptables.Interface) error {
			return ipt.RestoreAll(ctx, []byte("*filter\n:PROXYKIT-LOCK2 - [0:0]\nCOMMIT\n"), iptables.NoFlushTables, iptables.NoRestoreCounters)
		}},
	} {
		t.Run(tc.name+" waits", func(t *testing.T) {
			n := newNSIPT(t, ns, iptables.BackendLegacy, v1.IPv4Protocol, iptables.WithLockFile("/run/xtables.lock"))
			release := hold()
			result := make(chan error, 1)
			go func() { result <- n.do(tc.op) }()
			select {
			case err := <-result:
				release()
				t.Fatalf("returned while the lock was held: %v", err)
			case <-time.After(1500 * time.Millisecond):
			}
			release()
			if err := <-result; err != nil {
				t.Fatalf("after the lock was released: %v", err)
			}
		})
		t.Run(tc.name+" times out", func(t *testing.T) {
			n := newNSIPT(t, ns, iptables.BackendLegacy, v1.IPv4Protocol, iptables.WithLockFile("/run/xtables.lock"), iptables.WithLockWait(time.Second))
			release := hold()
			defer release()
			err := n.do(tc.op)
			if !iptables.IsLockTimeout(err) {
				t.Fatalf("got %v, want a lock timeout", err)
			}
		})
	}
}

// TestKernelDetectBackend checks detection in a namespace as rules appear
// in one backend, then more in the other.
func TestKernelDetectBackend(t *testing.T) {
	requireKernel(t)
	ns := kerneltest.NewNS(t)
	detect := func() iptables.Backend {
		t.Helper()
		var b iptables.Backend
		if err := ns.Do(func() (err error) { b, err = iptables.DetectBackend(context.Background(), nil); return err }); err != nil {
			t.Fatal(err)
		}
		return b
	}
	if got := detect(); got != iptables.BackendNFT {
		t.Errorf("empty namespace: detected %s, want nft", got)
	}
	execIn(t, ns, "iptables-legacy", "-A", "INPUT", "-j", "ACCEPT")
	execIn(t, ns, "ip6tables-legacy", "-A", "INPUT", "-j", "ACCEPT")
	if got := detect(); got != iptables.BackendLegacy {
		t.Errorf("legacy rules only: detected %s, want legacy", got)
	}
	for range 3 {
		execIn(t, ns, "iptables-nft", "-A", "INPUT", "-j", "ACCEPT")
	}
	if got := detect(); got != iptables.BackendNFT {
		t.Errorf("more nft rules: detected %s, want nft", got)
	}
	execIn(t, ns, "iptables-legacy", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT")
	if got := detect(); got != iptables.BackendLegacy {
		t.Errorf("kubelet's hint in legacy: detected %s, want legacy", got)
	}
	// New detects the same when not told.
	var ipt iptables.Interface
	if err := ns.Do(func() (err error) { ipt, err = iptables.New(context.Background(), v1.IPv4Protocol); return err }); err != nil {
		t.Fatal(err)
	}
	if ipt.Backend() != iptables.BackendLegacy {
		t.Errorf("New chose %s, want legacy", ipt.Backend())
	}
}
