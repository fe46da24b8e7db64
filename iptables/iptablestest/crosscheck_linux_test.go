package iptablestest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/iptables"
)

// realIPTables runs one backend's real binaries inside a throwaway
// network namespace.
type realIPTables struct {
	t       *testing.T
	ns      *kerneltest.NS
	backend iptables.Backend
	family  v1.IPFamily
}

func (r *realIPTables) binary(suffix string) string {
	base := "iptables"
	if r.family == v1.IPv6Protocol {
		base = "ip6tables"
	}
	return base + "-" + string(r.backend) + suffix
}

// run runs a binary of the backend in the namespace with stdin, and
// returns its output and exit status.
func (r *realIPTables) run(stdin string, suffix string, args ...string) (string, int) {
	r.t.Helper()
	var out bytes.Buffer
	status := 0
	err := r.ns.Do(func() error {
		cmd := exec.Command(r.binary(suffix), args...)
		// Legacy tables are per namespace: a lock of the namespace's
		// own keeps other tests' iptables runs from delaying these.
		cmd.Env = append(os.Environ(), "XTABLES_LOCKFILE="+r.lockFile())
		cmd.Stdin = strings.NewReader(stdin)
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			status = ee.ExitCode()
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				status = 128 + int(ws.Signal())
			}
			return nil
		}
		return err
	})
	if err != nil {
		r.t.Fatalf("%s %v: %v", r.binary(suffix), args, err)
	}
	return out.String(), status
}

// lockFile is the namespace's own xtables lock, removed when the test ends.
func (r *realIPTables) lockFile() string {
	path := os.TempDir() + "/proxykit-xtables-" + r.ns.Name + ".lock"
	r.t.Cleanup(func() { os.Remove(path) })
	return path
}

// restore runs iptables-restore with args and input. It waits for the
// xtables lock, which other tests on the machine may hold.
func (r *realIPTables) restore(input string, args ...string) (string, int) {
	return r.run(input, "-restore", append([]string{"-w", "30"}, args...)...)
}

// reset empties every table the tests use and loads state.
func (r *realIPTables) reset(state string) {
	r.t.Helper()
	if out, status := r.restore("*filter\nCOMMIT\n*nat\nCOMMIT\n*mangle\nCOMMIT\n*raw\nCOMMIT\n"); status != 0 {
		r.t.Fatalf("emptying tables: %s", out)
	}
	if out, status := r.restore(state); status != 0 {
		r.t.Fatalf("loading the initial state: %s", out)
	}
}

// tables returns what iptables-save prints, per table, without comments
// and with counters zeroed.
func (r *realIPTables) tables() map[string]string {
	r.t.Helper()
	out, status := r.run("", "-save")
	if status != 0 {
		r.t.Fatalf("iptables-save: %s", out)
	}
	return splitTables(out)
}

func splitTables(save string) map[string]string {
	tables := map[string]string{}
	var cur string
	var b strings.Builder
	for _, line := range strings.Split(save, "\n") {
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "*"):
			cur = line[1:]
			b.Reset()
			b.WriteString(line + "\n")
		case line == "COMMIT":
			b.WriteString(line + "\n")
			tables[cur] = b.String()
		case strings.HasPrefix(line, ":"):
			if i := strings.LastIndex(line, " ["); i >= 0 {
				line = line[:i] + " [0:0]"
			}
			b.WriteString(line + "\n")
		default:
			b.WriteString(line + "\n")
		}
	}
	return tables
}

// compareWithFake checks that the real tables equal the fake's, for every
// table the fake holds; tables the fake does not hold must have no rules.
func (r *realIPTables) compareWithFake(t *testing.T, f *Fake) {
	t.Helper()
	real := r.tables()
	fake := splitTables(f.Dump())
	for name, want := range fake {
		if _, ok := real[name]; !ok && isPristine(want) {
			// iptables-nft deletes a table restored empty; it is the
			// same as a table whose built-in chains accept everything.
			continue
		}
		if diff := cmp.Diff(want, real[name]); diff != "" {
			t.Errorf("table %s: kernel and fake differ (-fake +kernel):\n%s", name, diff)
		}
	}
	for name, got := range real {
		if _, ok := fake[name]; !ok && strings.Contains(got, "\n-A ") {
			t.Errorf("table %s has rules in the kernel but not in the fake:\n%s", name, got)
		}
	}
}

// isPristine reports whether a saved table has nothing but built-in chains
// that accept.
func isPristine(table string) bool {
	for _, line := range strings.Split(table, "\n") {
		if strings.HasPrefix(line, "-A ") || (strings.HasPrefix(line, ":") && !strings.Contains(line, " ACCEPT [")) {
			return false
		}
	}
	return true
}

func backends() []iptables.Backend {
	return []iptables.Backend{iptables.BackendLegacy, iptables.BackendNFT}
}

func requireBinaries(t *testing.T) {
	var tools []string
	for _, b := range backends() {
		for _, base := range []string{"iptables", "ip6tables"} {
			for _, s := range []string{"", "-save", "-restore"} {
				tools = append(tools, base+"-"+string(b)+s)
			}
		}
	}
	kerneltest.Require(t, append(tools, "ipset")...)
}

// TestCrossCheckRestoreErrors runs every input the fake refuses through
// the real iptables-restore of both backends, in a namespace: the real
// one must refuse it too (or, where the case says so, accept it), and
// must leave the same tables behind, compared rule by rule. A real
// restore is the reference rather than --test, which does not see what
// the kernel refuses.
func TestCrossCheckRestoreErrors(t *testing.T) {
	requireBinaries(t)
	for _, backend := range backends() {
		t.Run(string(backend), func(t *testing.T) {
			r := &realIPTables{t: t, ns: kerneltest.NewNS(t), backend: backend, family: v1.IPv4Protocol}
			for _, tc := range restoreErrorCases {
				t.Run(tc.name, func(t *testing.T) {
					r.t = t
					r.reset(before)
					realAccepts := tc.notModelled || (backend == iptables.BackendLegacy && tc.legacyAccepts) ||
						(backend == iptables.BackendNFT && tc.nftAccepts)
					testOut, testStatus := r.restore(tc.input, "--noflush", "--test")
					out, status := r.restore(tc.input, "--noflush")
					if (status == 0) != realAccepts {
						t.Fatalf("real iptables-restore: status %d (%s), want it to accept: %v", status, strings.TrimSpace(out), realAccepts)
					}
					if realAccepts {
						return
					}
					// --test only parses: it sees bad arguments but not
					// what the kernel refuses at commit, and the backends
					// differ in what they check where. The real restore
					// above is the reference; this is for information.
					if testStatus != 0 {
						t.Logf("--test refuses it too: %s", strings.TrimSpace(testOut))
					} else {
						t.Logf("--test accepts it (the refusal comes from the kernel or at commit)")
					}
					f := NewFake(WithBackend(backend))
					if err := f.ParseDump(before); err != nil {
						t.Fatal(err)
					}
					if err := f.RestoreAll(context.Background(), []byte(tc.input), iptables.NoFlushTables, iptables.NoRestoreCounters); err == nil {
						t.Fatal("the fake accepts it")
					}
					r.compareWithFake(t, f)
				})
			}
		})
	}
}

// TestCrossCheckRestores runs restores the fake accepts through the real
// binaries, with and without --test, and compares the resulting tables,
// rule by rule, with the fake's.
func TestCrossCheckRestores(t *testing.T) {
	requireBinaries(t)
	type restoreCase struct {
		name, initial, input string
		flush                iptables.FlushFlag
		only                 iptables.Table
		family               v1.IPFamily
		// backend, if set, is the only backend the case is about.
		backend    iptables.Backend
		nftCrashes bool
		sets       []string
	}
	var cases []restoreCase
	for _, tc := range restoreCases {
		cases = append(cases, restoreCase{name: tc.name, initial: before, input: tc.input, flush: tc.flush, only: tc.only,
			backend: tc.backend, nftCrashes: tc.nftCrashes})
	}
	for _, file := range []struct {
		path   string
		family v1.IPFamily
		sets   []string
	}{
		{"testdata/canonical-input.txt", v1.IPv4Protocol, []string{"myset"}},
		{"testdata/canonical6-input.txt", v1.IPv6Protocol, nil},
	} {
		data, err := os.ReadFile(file.path)
		if err != nil {
			t.Fatal(err)
		}
		cases = append(cases, restoreCase{name: file.path, input: string(data), flush: iptables.FlushTables, family: file.family, sets: file.sets})
	}
	cases = append(cases,
		restoreCase{name: "service rules", input: serviceRules, flush: iptables.FlushTables},
		restoreCase{name: "generated services", input: string(serviceRestore(3000)), flush: iptables.FlushTables},
	)
	for _, backend := range backends() {
		t.Run(string(backend), func(t *testing.T) {
			ns := kerneltest.NewNS(t)
			for _, tc := range cases {
				if tc.family == "" {
					tc.family = v1.IPv4Protocol
				}
				t.Run(tc.name, func(t *testing.T) {
					if tc.backend != "" && tc.backend != backend {
						t.Skipf("the case is about the %s backend", tc.backend)
					}
					if backend == iptables.BackendNFT && tc.nftCrashes {
						// Show that the crash is real, so the skip is
						// honest and notices a fixed iptables.
						r := &realIPTables{t: t, ns: ns, backend: backend, family: tc.family}
						r.reset(tc.initial)
						if _, status := r.restore(tc.input, "--noflush"); status < 128 {
							t.Fatalf("iptables-nft-restore exited with %d; it used to crash on this input", status)
						}
						t.Skip("iptables-nft-restore 1.8.9 crashes (SIGSEGV) on -R of a rule added by the same input")
					}
					r := &realIPTables{t: t, ns: ns, backend: backend, family: tc.family}
					for _, set := range tc.sets {
						family := "inet"
						if tc.family == v1.IPv6Protocol {
							family = "inet6"
						}
						ns.MustExec(t, "ipset", "-exist", "create", set, "hash:ip,port", "family", family)
					}
					r.reset(tc.initial)
					newFake := NewFake
					if tc.family == v1.IPv6Protocol {
						newFake = NewIPv6Fake
					}
					f := newFake(WithBackend(backend), WithIPSets(func(name string) bool {
						for _, s := range tc.sets {
							if s == name {
								return true
							}
						}
						return false
					}))
					if err := f.ParseDump(tc.initial); err != nil {
						t.Fatal(err)
					}
					var args []string
					if tc.only != "" {
						args = append(args, "-T", string(tc.only))
					}
					if !tc.flush {
						args = append(args, "--noflush")
					}
					if out, status := r.restore(tc.input, append(args, "--test")...); status != 0 {
						t.Fatalf("iptables-restore --test refuses what the fake accepts: %s", out)
					}
					if out, status := r.restore(tc.input, args...); status != 0 {
						t.Fatalf("iptables-restore refuses what the fake accepts: %s", out)
					}
					if err := restoreInto(f, tc.only, tc.input, tc.flush); err != nil {
						t.Fatal(err)
					}
					r.compareWithFake(t, f)
				})
			}
		})
	}
}
