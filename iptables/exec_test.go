package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"
	utilexec "k8s.io/utils/exec"
)

// result is what a scripted command does.
type result struct {
	stdout, stderr string
	status         int
	// hang makes the command run until its context ends, as a hung
	// binary does until it is killed; it then fails as a killed process.
	hang bool
}

// scriptExec is a utilexec.Interface that answers commands from a
// function and records them.
type scriptExec struct {
	mu     sync.Mutex
	paths  map[string]bool
	handle func(name string, args []string, stdin string) result
	calls  []string
	stdins []string
	envs   [][]string
}

func (e *scriptExec) Command(name string, args ...string) utilexec.Cmd {
	return &scriptCmd{e: e, name: name, args: args}
}

func (e *scriptExec) CommandContext(ctx context.Context, name string, args ...string) utilexec.Cmd {
	return &scriptCmd{e: e, ctx: ctx, name: name, args: args}
}

func (e *scriptExec) LookPath(file string) (string, error) {
	if e.paths[file] {
		return "/usr/sbin/" + file, nil
	}
	return "", &exec.Error{Name: file, Err: exec.ErrNotFound}
}

func (e *scriptExec) commands() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.calls...)
}

type scriptCmd struct {
	e              *scriptExec
	ctx            context.Context // nil for Command
	name           string
	args           []string
	env            []string
	stdin          io.Reader
	stdout, stderr io.Writer
}

type exitError struct{ status int }

func (x exitError) Error() string   { return fmt.Sprintf("exit status %d", x.status) }
func (x exitError) String() string  { return x.Error() }
func (x exitError) Exited() bool    { return true }
func (x exitError) ExitStatus() int { return x.status }

// killedError is the error of a process ended by a signal, as os/exec
// reports a command it killed when its context ended.
type killedError struct{}

func (killedError) Error() string   { return "signal: killed" }
func (killedError) String() string  { return "signal: killed" }
func (killedError) Exited() bool    { return false }
func (killedError) ExitStatus() int { return -1 }

func (c *scriptCmd) Run() error {
	var in []byte
	if c.stdin != nil {
		in, _ = io.ReadAll(c.stdin)
	}
	c.e.mu.Lock()
	c.e.calls = append(c.e.calls, strings.Join(append([]string{c.name}, c.args...), " "))
	c.e.stdins = append(c.e.stdins, string(in))
	c.e.envs = append(c.e.envs, c.env)
	c.e.mu.Unlock()
	r := c.e.handle(c.name, c.args, string(in))
	if r.hang {
		if c.ctx == nil {
			panic("scriptExec: a command without a context hangs forever")
		}
		<-c.ctx.Done()
		return killedError{}
	}
	if c.stdout != nil {
		io.WriteString(c.stdout, r.stdout)
	}
	if c.stderr != nil {
		io.WriteString(c.stderr, r.stderr)
	}
	if r.status != 0 {
		return exitError{r.status}
	}
	return nil
}

func (c *scriptCmd) CombinedOutput() ([]byte, error) {
	var b bytes.Buffer
	c.stdout, c.stderr = &b, &b
	err := c.Run()
	return b.Bytes(), err
}

func (c *scriptCmd) Output() ([]byte, error) {
	var b bytes.Buffer
	c.stdout = &b
	err := c.Run()
	return b.Bytes(), err
}

func (c *scriptCmd) SetDir(string)                      {}
func (c *scriptCmd) SetStdin(in io.Reader)              { c.stdin = in }
func (c *scriptCmd) SetStdout(out io.Writer)            { c.stdout = out }
func (c *scriptCmd) SetStderr(out io.Writer)            { c.stderr = out }
func (c *scriptCmd) SetEnv(env []string)                { c.env = env }
func (c *scriptCmd) StdoutPipe() (io.ReadCloser, error) { return nil, errors.New("not supported") }
func (c *scriptCmd) StderrPipe() (io.ReadCloser, error) { return nil, errors.New("not supported") }
func (c *scriptCmd) Start() error                       { return errors.New("not supported") }
func (c *scriptCmd) Wait() error                        { return errors.New("not supported") }
func (c *scriptCmd) Stop()                              {}

// allBinaries are the suffixed binaries of both backends.
func allBinaries() map[string]bool {
	m := map[string]bool{}
	for _, base := range []string{"iptables", "ip6tables"} {
		for _, b := range []string{"legacy", "nft"} {
			for _, s := range []string{"", "-save", "-restore"} {
				m[base+"-"+b+s] = true
			}
		}
	}
	return m
}

// newTestRunner returns a runner of version (as "iptables --version"
// prints it) over a scriptExec whose other commands are answered by
// handle.
func newTestRunner(t *testing.T, backend Backend, family v1.IPFamily, version string, handle func(name string, args []string, stdin string) result) (*runner, *scriptExec) {
	t.Helper()
	e := &scriptExec{paths: allBinaries()}
	e.handle = func(name string, args []string, stdin string) result {
		if len(args) == 1 && args[0] == "--version" {
			return result{stdout: version + "\n"}
		}
		if handle == nil {
			if len(args) > 0 && slices.Contains(args, "-C") {
				return result{stderr: "iptables: Bad rule (does a matching rule exist in that chain?).\n", status: 1}
			}
			return result{}
		}
		return handle(name, args, stdin)
	}
	r, err := newRunner(context.Background(), family, options{exec: e, backend: backend, clock: clocktesting.NewFakeClock(time.Now()), lockWait: DefaultLockWait})
	if err != nil {
		t.Fatal(err)
	}
	e.calls = nil
	return r, e
}

func TestRunnerCommands(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		backend Backend
		family  v1.IPFamily
		version string
		do      func(r *runner) error
		want    []string
	}{
		{
			name: "EnsureChain on 1.8.9 legacy", backend: BackendLegacy, family: v1.IPv4Protocol, version: "iptables v1.8.9 (legacy)",
			do:   func(r *runner) error { _, err := r.EnsureChain(ctx, TableNAT, "KUBE-SERVICES"); return err },
			want: []string{"iptables-legacy -w 5 -t nat -N KUBE-SERVICES"},
		},
		{
			name: "IPv6 nft", backend: BackendNFT, family: v1.IPv6Protocol, version: "ip6tables v1.8.9 (nf_tables)",
			do:   func(r *runner) error { return r.FlushChain(ctx, TableFilter, "X") },
			want: []string{"ip6tables-nft -w 5 -t filter -F X"},
		},
		{
			name: "1.6.1 adds -W", backend: BackendLegacy, family: v1.IPv4Protocol, version: "iptables v1.6.1",
			do:   func(r *runner) error { return r.DeleteChain(ctx, TableFilter, "X") },
			want: []string{"iptables-legacy -w 5 -W 100000 -t filter -X X"},
		},
		{
			name: "1.4.21 waits forever", backend: BackendLegacy, family: v1.IPv4Protocol, version: "iptables v1.4.21",
			do:   func(r *runner) error { return r.DeleteChain(ctx, TableFilter, "X") },
			want: []string{"iptables-legacy -w -t filter -X X"},
		},
		{
			name: "1.4.19 cannot wait", backend: BackendLegacy, family: v1.IPv4Protocol, version: "iptables v1.4.19",
			do:   func(r *runner) error { return r.DeleteChain(ctx, TableFilter, "X") },
			want: []string{"iptables-legacy -t filter -X X"},
		},
		{
			name: "ChainExists lists one rule", backend: BackendNFT, family: v1.IPv4Protocol, version: "iptables v1.8.9 (nf_tables)",
			do:   func(r *runner) error { _, err := r.ChainExists(ctx, TableNAT, "C"); return err },
			want: []string{"iptables-nft -w 5 -t nat -S C 1"},
		},
		{
			name: "EnsureRule checks then appends", backend: BackendNFT, family: v1.IPv4Protocol, version: "iptables v1.8.9 (nf_tables)",
			do: func(r *runner) error {
				_, err := r.EnsureRule(ctx, Append, TableNAT, "C", "-m", "comment", "--comment", "a b", "-j", "RETURN")
				return err
			},
			want: []string{
				"iptables-nft -w 5 -t nat -C C -m comment --comment a b -j RETURN",
				"iptables-nft -w 5 -t nat -A C -m comment --comment a b -j RETURN",
			},
		},
		{
			name: "Restore one table with wait", backend: BackendNFT, family: v1.IPv4Protocol, version: "iptables v1.8.9 (nf_tables)",
			do: func(r *runner) error {
				return r.Restore(ctx, TableNAT, []byte("*nat\nCOMMIT\n"), NoFlushTables, RestoreCounters)
			},
			want: []string{"iptables-nft-restore -w 5 -T nat --noflush --counters"},
		},
		{
			name: "RestoreAll flushing", backend: BackendNFT, family: v1.IPv6Protocol, version: "ip6tables v1.8.9 (nf_tables)",
			do: func(r *runner) error {
				return r.RestoreAll(ctx, []byte("*nat\nCOMMIT\n"), FlushTables, NoRestoreCounters)
			},
			want: []string{"ip6tables-nft-restore -w 5"},
		},
		{
			name: "restore 1.6.2 waits with interval", backend: BackendLegacy, family: v1.IPv4Protocol, version: "iptables v1.6.2",
			do:   func(r *runner) error { return r.RestoreAll(ctx, nil, NoFlushTables, NoRestoreCounters) },
			want: []string{"iptables-legacy-restore -w 5 -W 100000 --noflush"},
		},
		{
			name: "SaveInto", backend: BackendLegacy, family: v1.IPv4Protocol, version: "iptables v1.8.9 (legacy)",
			do:   func(r *runner) error { return r.SaveInto(ctx, TableMangle, &bytes.Buffer{}) },
			want: []string{"iptables-legacy-save -t mangle"},
		},
		{
			name: "Present", backend: BackendLegacy, family: v1.IPv4Protocol, version: "iptables v1.8.9 (legacy)",
			do:   func(r *runner) error { return r.Present(ctx) },
			want: []string{"iptables-legacy -w 5 -t nat -S POSTROUTING 1"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, e := newTestRunner(t, tc.backend, tc.family, tc.version, nil)
			if err := tc.do(r); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, e.commands()); diff != "" {
				t.Errorf("commands (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRunnerResults(t *testing.T) {
	ctx := context.Background()
	const (
		noChain = "iptables: No chain/target/match by that name.\n"
		badRule = "iptables: Bad rule (does a matching rule exist in that chain?).\n"
	)
	for _, tc := range []struct {
		name    string
		reply   result
		do      func(r *runner) (any, error)
		want    any
		wantErr func(error) bool
	}{
		{
			name:  "EnsureChain of an existing chain",
			reply: result{stderr: "iptables: Chain already exists.\n", status: 1},
			do:    func(r *runner) (any, error) { return r.EnsureChain(ctx, TableNAT, "C") },
			want:  true,
		},
		{
			name:    "EnsureChain failing otherwise",
			reply:   result{stderr: "iptables: Permission denied\n", status: 4},
			do:      func(r *runner) (any, error) { return r.EnsureChain(ctx, TableNAT, "C") },
			want:    false,
			wantErr: func(err error) bool { return err != nil && !IsNotFound(err) },
		},
		{
			name:    "FlushChain of a missing chain",
			reply:   result{stderr: noChain, status: 1},
			do:      func(r *runner) (any, error) { return nil, r.FlushChain(ctx, TableNAT, "C") },
			wantErr: IsNotFound,
		},
		{
			name:  "ChainExists of a missing chain (legacy message)",
			reply: result{stderr: noChain, status: 1},
			do:    func(r *runner) (any, error) { return r.ChainExists(ctx, TableNAT, "C") },
			want:  false,
		},
		{
			name:  "RuleExists of a missing rule",
			reply: result{stderr: badRule, status: 1},
			do:    func(r *runner) (any, error) { return r.RuleExists(ctx, TableNAT, "C", "-j", "ACCEPT") },
			want:  false,
		},
		{
			name:    "RuleExists with bad arguments",
			reply:   result{stderr: "iptables v1.8.9 (legacy): unknown option \"--bogus\"\n", status: 2},
			do:      func(r *runner) (any, error) { return r.RuleExists(ctx, TableNAT, "C", "--bogus") },
			want:    false,
			wantErr: func(err error) bool { return exitStatus(err) == 2 },
		},
		{
			name:  "RuleExists jumping to a missing chain (legacy message)",
			reply: result{stderr: "iptables v1.8.9 (legacy): Couldn't load target `KUBE-X':No such file or directory\n", status: 2},
			do:    func(r *runner) (any, error) { return r.RuleExists(ctx, TableNAT, "C", "-j", "KUBE-X") },
			want:  false,
		},
		{
			name:  "DeleteRule jumping to a missing chain (nft message)",
			reply: result{stderr: "iptables v1.8.9 (nf_tables): Chain 'KUBE-X' does not exist\n", status: 2},
			do: func(r *runner) (any, error) {
				return nil, r.DeleteRule(ctx, TableNAT, "C", "-m", "comment", "--comment", "x", "-j", "KUBE-X")
			},
		},
		{
			name:  "DeleteRule of a missing rule is not an error",
			reply: result{stderr: badRule, status: 1},
			do:    func(r *runner) (any, error) { return nil, r.DeleteRule(ctx, TableNAT, "C", "-j", "ACCEPT") },
		},
		{
			name:    "lock timeout",
			reply:   result{stderr: "Another app is currently holding the xtables lock. Stopped waiting after 5s.\n", status: 4},
			do:      func(r *runner) (any, error) { return nil, r.FlushChain(ctx, TableNAT, "C") },
			wantErr: IsLockTimeout,
		},
		{
			name:  "restore error carries the line",
			reply: result{stderr: "iptables-restore v1.8.9 (legacy): Couldn't load target `NOPE':No such file or directory\n\nError occurred at line: 7\nTry `iptables-restore -h' or 'iptables-restore --help' for more information.\n", status: 2},
			do:    func(r *runner) (any, error) { return nil, r.RestoreAll(ctx, nil, NoFlushTables, NoRestoreCounters) },
			wantErr: func(err error) bool {
				var e *Error
				return errors.As(err, &e) && e.Line == 7 && e.ExitStatus == 2 &&
					e.Error() == "iptables-legacy-restore -w 5 --noflush: exit status 2: iptables-restore v1.8.9 (legacy): Couldn't load target `NOPE':No such file or directory; Error occurred at line: 7"
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := newTestRunner(t, BackendLegacy, v1.IPv4Protocol, "iptables v1.8.9 (legacy)", func(string, []string, string) result { return tc.reply })
			got, err := tc.do(r)
			if tc.wantErr == nil && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if tc.wantErr != nil && !tc.wantErr(err) {
				t.Fatalf("error %v is not the one expected", err)
			}
			if diff := cmp.Diff(tc.want, got); tc.want != nil && diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
		})
	}
}

// TestChainExistsNFTIncompatible checks the fallback for iptables-nft's
// "incompatible" message, which it also prints for missing chains.
func TestChainExistsNFTIncompatible(t *testing.T) {
	for _, tc := range []struct {
		save string
		want bool
	}{
		{save: "*nat\n:PREROUTING ACCEPT [0:0]\n:C - [0:0]\nCOMMIT\n", want: true},
		{save: "*nat\n:PREROUTING ACCEPT [0:0]\n:CC - [0:0]\nCOMMIT\n", want: false},
	} {
		r, e := newTestRunner(t, BackendNFT, v1.IPv4Protocol, "iptables v1.8.9 (nf_tables)", func(name string, args []string, _ string) result {
			if name == "iptables-nft-save" {
				return result{stdout: tc.save}
			}
			return result{stderr: "iptables v1.8.9 (nf_tables): chain `C' in table `nat' is incompatible, use 'nft' tool.\n", status: 1}
		})
		got, err := r.ChainExists(context.Background(), TableNAT, "C")
		if err != nil || got != tc.want {
			t.Errorf("ChainExists = %v, %v; want %v (commands %v)", got, err, tc.want, e.commands())
		}
	}
}

// TestCommandTimeout checks that a command that never returns is killed
// after the runner's timeout, for every kind of command, with an error
// that IsCommandTimeout recognises and that names the timeout; and that
// the caller ending the context is not mistaken for a timeout.
func TestCommandTimeout(t *testing.T) {
	const timeout = 20 * time.Millisecond
	calls := map[string]func(r *runner, ctx context.Context) error{
		"Restore": func(r *runner, ctx context.Context) error {
			return r.RestoreAll(ctx, []byte("*nat\nCOMMIT\n"), NoFlushTables, RestoreCounters)
		},
		"SaveInto": func(r *runner, ctx context.Context) error {
			return r.SaveInto(ctx, TableNAT, new(bytes.Buffer))
		},
		"FlushChain": func(r *runner, ctx context.Context) error {
			return r.FlushChain(ctx, TableNAT, "C")
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			r, _ := newTestRunner(t, BackendNFT, v1.IPv4Protocol, "iptables v1.8.9 (nf_tables)", func(string, []string, string) result {
				return result{hang: true}
			})
			r.timeout = timeout
			err := call(r, context.Background())
			if !IsCommandTimeout(err) {
				t.Fatalf("error %v: IsCommandTimeout is false", err)
			}
			if want := "timed out after " + timeout.String(); !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
			if IsNotFound(err) || IsLockTimeout(err) {
				t.Errorf("error %v: taken for a missing object or a lock timeout", err)
			}

			ctx, cancel := context.WithCancel(context.Background())
			r.timeout = time.Hour
			cancel()
			if err := call(r, ctx); err == nil || IsCommandTimeout(err) {
				t.Errorf("cancelled by the caller: error %v, want a failure that is not a timeout", err)
			}
		})
	}
}

func TestCommandTimeoutOption(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
		want time.Duration
	}{
		{name: "default", want: DefaultCommandTimeout},
		{name: "set", opts: []Option{WithCommandTimeout(time.Minute)}, want: time.Minute},
		{name: "none", opts: []Option{WithCommandTimeout(0)}, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &scriptExec{paths: allBinaries(), handle: func(string, []string, string) result {
				return result{stdout: "iptables v1.8.9 (legacy)\n"}
			}}
			ipt, err := New(context.Background(), v1.IPv4Protocol, append([]Option{WithExec(e), WithBackend(BackendLegacy)}, tc.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			if got := ipt.(*runner).timeout; got != tc.want {
				t.Errorf("timeout %v, want %v", got, tc.want)
			}
		})
	}
}

func TestRunnerFeatures(t *testing.T) {
	for _, tc := range []struct {
		version     string
		randomFully bool
		checkErr    bool
	}{
		{version: "iptables v1.8.9 (nf_tables)", randomFully: true},
		{version: "iptables v1.6.2", randomFully: true},
		{version: "iptables v1.6.1", randomFully: false},
		{version: "iptables v1.4.10", randomFully: false, checkErr: true},
	} {
		r, e := newTestRunner(t, BackendLegacy, v1.IPv4Protocol, tc.version, nil)
		if got := r.HasRandomFully(); got != tc.randomFully {
			t.Errorf("%s: HasRandomFully = %v, want %v", tc.version, got, tc.randomFully)
		}
		_, err := r.EnsureRule(context.Background(), Append, TableNAT, "C", "-j", "ACCEPT")
		if (err != nil) != tc.checkErr {
			t.Errorf("%s: EnsureRule error = %v, want error %v", tc.version, err, tc.checkErr)
		}
		if tc.checkErr && (!strings.Contains(err.Error(), "1.4.11") || len(e.commands()) != 0) {
			t.Errorf("%s: EnsureRule should fail without running anything and name the version needed: %v, ran %v", tc.version, err, e.commands())
		}
	}
}

func TestLockFileOption(t *testing.T) {
	e := &scriptExec{paths: allBinaries(), handle: func(string, []string, string) result { return result{stdout: "iptables v1.8.9 (legacy)\n"} }}
	r, err := newRunner(context.Background(), v1.IPv4Protocol, options{exec: e, backend: BackendLegacy, lockFile: "/tmp/my.lock", lockWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.FlushChain(context.Background(), TableNAT, "X"); err != nil {
		t.Fatal(err)
	}
	env := e.envs[len(e.envs)-1]
	if !slices.Contains(env, "XTABLES_LOCKFILE=/tmp/my.lock") || len(env) < 2 || r.lockFile != "/tmp/my.lock" {
		t.Errorf("environment %v, lock file %q; want XTABLES_LOCKFILE=/tmp/my.lock added to the process's environment", env, r.lockFile)
	}
	var o options
	WithLockFile("")(&o)
	WithLockFile("/a")(&o)
	if o.lockFile != "/a" {
		t.Errorf("WithLockFile: %q", o.lockFile)
	}
}

// TestNewRefuses checks that New refuses an unknown backend or IP family
// with an error naming it, before it runs anything.
func TestNewRefuses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		family  v1.IPFamily
		backend Backend
		want    string
	}{
		{name: "unknown backend", family: v1.IPv4Protocol, backend: "ebpf", want: `unknown iptables backend "ebpf"`},
		{name: "unknown family", family: "IPv5", backend: BackendNFT, want: `iptables: unknown IP family "IPv5"`},
		{name: "empty family", family: "", backend: BackendNFT, want: `iptables: unknown IP family ""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &scriptExec{paths: allBinaries(), handle: func(string, []string, string) result { return result{stdout: "iptables v1.8.9\n"} }}
			ipt, err := New(context.Background(), tc.family, WithExec(e), WithBackend(tc.backend))
			if err == nil {
				t.Fatalf("New(%q, %q) = %v, want an error", tc.family, tc.backend, ipt)
			}
			if diff := cmp.Diff(tc.want, err.Error()); diff != "" {
				t.Errorf("New(%q, %q) error (-want +got):\n%s", tc.family, tc.backend, diff)
			}
		})
	}
}

// TestNewVersionProbeTimeout checks that New gives up on an
// "iptables --version" that never returns, after the command timeout.
func TestNewVersionProbeTimeout(t *testing.T) {
	e := &scriptExec{paths: allBinaries(), handle: func(string, []string, string) result { return result{hang: true} }}
	_, err := New(context.Background(), v1.IPv4Protocol, WithExec(e), WithBackend(BackendNFT), WithCommandTimeout(20*time.Millisecond))
	if err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("New with a hung --version: error %v, want one saying it was killed", err)
	}
}

// TestCommandTimeoutRealProcess runs New's Interface over stand-in
// binaries on PATH whose iptables-restore is a shell waiting on a child
// that holds its output open, as a hung restore that forked would: the
// timeout must kill it and RestoreAll return, once the wait delay for the
// child's pipes has passed, with a timeout error.
func TestCommandTimeoutRealProcess(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	dir := t.TempDir()
	scripts := map[string]string{
		"iptables-nft":         "#!/bin/sh\necho 'iptables v1.8.9 (nf_tables)'\n",
		"iptables-nft-save":    "#!/bin/sh\n",
		"iptables-nft-restore": "#!/bin/sh\ncat >/dev/null\nsleep 300\n",
	}
	for name, body := range scripts {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	ipt, err := New(context.Background(), v1.IPv4Protocol, WithBackend(BackendNFT), WithCommandTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- ipt.RestoreAll(context.Background(), []byte("*nat\nCOMMIT\n"), NoFlushTables, RestoreCounters)
	}()
	select {
	case err := <-done:
		if !IsCommandTimeout(err) {
			t.Errorf("RestoreAll of a hung restore: %v, want a command timeout", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("RestoreAll still waits for the hung restore")
	}
}
