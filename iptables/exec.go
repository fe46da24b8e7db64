package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	utilexec "k8s.io/utils/exec"

	"github.com/proxykit/proxykit/internal/boundedexec"
)

// DefaultLockWait is how long commands wait for the xtables lock unless
// [WithLockWait] says otherwise.
const DefaultLockWait = 5 * time.Second

// DefaultCommandTimeout is how long one run of iptables, iptables-save or
// iptables-restore may take unless [WithCommandTimeout] says otherwise. The
// slowest restore measured (BENCHMARKS.md), a second full sync of 5,000
// services of 100 endpoints on the nft backend, takes well under half of
// it. Fifteen minutes leaves room for larger or
// slower nodes, and still ends a hung command, which would otherwise stop
// every later sync, well before anyone would wait for it by hand.
const DefaultCommandTimeout = 15 * time.Minute

// lockFilePath is the xtables lock of iptables 1.6.0 and later.
const lockFilePath = "/run/xtables.lock"

// Option configures the Interface made by [New].
type Option func(*options)

type options struct {
	exec     utilexec.Interface
	backend  Backend
	clock    clock.Clock
	lockWait time.Duration
	lockFile string
	timeout  time.Duration
}

// WithExec makes the Interface run commands through e instead of the real
// os/exec, for tests (k8s.io/utils/exec/testing) or for running them
// elsewhere. A nil e is ignored.
func WithExec(e utilexec.Interface) Option {
	return func(o *options) {
		if e != nil {
			o.exec = e
		}
	}
}

// WithBackend makes the Interface use backend b instead of detecting it
// with [DetectBackend].
func WithBackend(b Backend) Option {
	return func(o *options) { o.backend = b }
}

// WithClock makes Monitor and the wait for the xtables lock use c instead
// of the real clock. A nil c is ignored.
func WithClock(c clock.Clock) Option {
	return func(o *options) {
		if c != nil {
			o.clock = c
		}
	}
}

// WithLockWait sets how long each command waits for the xtables lock held
// by another program before failing with an error for which
// [IsLockTimeout] is true. It is rounded up to whole seconds (at least
// one), the unit iptables takes. iptables 1.4.20 and 1.4.21 can only wait
// forever; older versions cannot wait at all. The nft backend has no such
// lock and ignores this. The default is [DefaultLockWait].
func WithLockWait(d time.Duration) Option {
	return func(o *options) { o.lockWait = d }
}

// WithLockFile makes the Interface use path as the xtables lock instead of
// /run/xtables.lock: it runs the binaries with XTABLES_LOCKFILE=path in
// their environment (iptables 1.8 honours it) and takes that file itself
// for an iptables-restore too old to wait. The lock only needs to be
// shared by the programs that change the same network namespace's legacy
// tables, so a program working in a namespace of its own can use a lock
// of its own and not wait for the host's. An empty path is ignored.
func WithLockFile(path string) Option {
	return func(o *options) { o.lockFile = path }
}

// WithCommandTimeout bounds each run of a binary (iptables, iptables-save,
// iptables-restore): when d passes, the process is killed and the method
// returns an error for which [IsCommandTimeout] is true. [New]'s own
// "--version" probes share one such bound (their error then just says the
// process was killed), and [DetectBackend]'s iptables-save runs have a
// shorter one of their own. Zero or less means no bound. The default is
// [DefaultCommandTimeout]; set it well above the longest restore the
// node's tables need (see BENCHMARKS.md), since a restore killed half-way
// is retried in full.
func WithCommandTimeout(d time.Duration) Option {
	return func(o *options) { o.timeout = d }
}

// runner is the Interface that runs the real binaries.
type runner struct {
	exec     utilexec.Interface
	clock    clock.Clock
	family   v1.IPFamily
	backend  Backend
	cmds     commands
	version  Version
	feat     features
	lockWait time.Duration
	// lockFile is the path of the xtables lock file.
	lockFile string
	// env is the environment of the commands, nil for the process's own.
	env []string
	// timeout bounds each command; zero means no bound.
	timeout time.Duration

	// mu makes the check-then-change of EnsureRule, DeleteRule and
	// EnsureChain atomic with respect to each other within this process.
	mu sync.Mutex
}

var _ Interface = (*runner)(nil)

// New returns the Interface for family that runs the real iptables binaries:
// iptables for v1.IPv4Protocol, ip6tables for v1.IPv6Protocol; any other
// family is an error naming it. It finds the backend (from [WithBackend], or by
// [DetectBackend]) and its binaries, and runs "iptables --version" to learn
// what they can do; any failure there is an error. Old versions are
// accepted, with degraded features: before 1.4.11 the rule methods that
// need -C fail with a clear error, before 1.6.2 iptables-restore cannot
// wait for the xtables lock so New's Interface takes the lock itself, and
// HasRandomFully reports false. On platforms other than Linux, New returns
// an error wrapping [ErrNotSupported].
func New(ctx context.Context, family v1.IPFamily, opts ...Option) (Interface, error) {
	if err := platformSupported(); err != nil {
		return nil, err
	}
	o := options{exec: boundedexec.New(0), clock: clock.RealClock{}, lockWait: DefaultLockWait, timeout: DefaultCommandTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	return newRunner(ctx, family, o)
}

func newRunner(ctx context.Context, family v1.IPFamily, o options) (*runner, error) {
	if family != v1.IPv4Protocol && family != v1.IPv6Protocol {
		return nil, fmt.Errorf("iptables: unknown IP family %q", family)
	}
	backend := o.backend
	if backend == "" {
		var err error
		if backend, err = DetectBackend(ctx, o.exec); err != nil {
			return nil, err
		}
	}
	// The --version probes get the same bound as every later command.
	vctx := ctx
	if o.timeout > 0 {
		var cancel context.CancelFunc
		vctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	cmds, version, err := resolveCommands(vctx, o.exec, backend, family)
	if err != nil {
		return nil, err
	}
	r := &runner{
		exec:     o.exec,
		clock:    o.clock,
		family:   family,
		backend:  backend,
		cmds:     cmds,
		version:  version,
		feat:     featuresOf(version, o.lockWait),
		lockWait: o.lockWait,
		lockFile: lockFilePath,
		timeout:  o.timeout,
	}
	if o.lockFile != "" {
		r.lockFile = o.lockFile
		r.env = append(os.Environ(), "XTABLES_LOCKFILE="+o.lockFile)
	}
	klog.FromContext(ctx).V(2).Info("Using iptables", "family", family, "backend", backend, "command", cmds.iptables, "version", version, "randomFully", r.feat.randomFully)
	return r, nil
}

func newError(command string, args []string, err error, stderr string) *Error {
	e := &Error{Command: command, Args: args, ExitStatus: -1, Stderr: strings.TrimSpace(stderr), Err: err}
	var ee utilexec.ExitError
	if errors.As(err, &ee) && ee.Exited() {
		e.ExitStatus = ee.ExitStatus()
	}
	return e
}

// command returns the command name with args, in the runner's
// environment, bound to ctx and the runner's timeout, and the function that
// runs it: it returns the error of Run, wrapped in a *commandTimeout when
// the timeout killed the command.
func (r *runner) command(ctx context.Context, name string, args ...string) (utilexec.Cmd, func() error) {
	run := func(cmd utilexec.Cmd) error { return cmd.Run() }
	if r.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, r.timeout, &commandTimeout{after: r.timeout})
		run = func(cmd utilexec.Cmd) error {
			defer cancel()
			err := cmd.Run()
			if err != nil && ctx.Err() != nil {
				// The command ended because its context did; say why
				// when it was the timeout rather than the caller.
				var t *commandTimeout
				if cause := context.Cause(ctx); errors.As(cause, &t) {
					return fmt.Errorf("%w (%w)", t, err)
				}
			}
			return err
		}
	}
	cmd := r.exec.CommandContext(ctx, name, args...)
	if r.env != nil {
		cmd.SetEnv(r.env)
	}
	return cmd, func() error { return run(cmd) }
}

// run runs iptables with the wait flag and args, and returns its standard
// output.
func (r *runner) run(ctx context.Context, args ...string) ([]byte, error) {
	full := make([]string, 0, len(r.feat.waitFlag)+len(args))
	full = append(append(full, r.feat.waitFlag...), args...)
	klog.FromContext(ctx).V(4).Info("Running iptables", "command", r.cmds.iptables, "args", full)
	var stdout, stderr bytes.Buffer
	cmd, run := r.command(ctx, r.cmds.iptables, full...)
	cmd.SetStdout(&stdout)
	cmd.SetStderr(&stderr)
	if err := run(); err != nil {
		return stdout.Bytes(), newError(r.cmds.iptables, full, err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// exitStatus returns the exit status of err if it is an *Error from a
// command that exited, else -1.
func exitStatus(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.ExitStatus
	}
	return -1
}

// EnsureChain is part of Interface.
func (r *runner) EnsureChain(ctx context.Context, table Table, chain Chain) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, err := r.run(ctx, "-t", string(table), "-N", string(chain))
	if err == nil {
		return false, nil
	}
	var e *Error
	if errors.As(err, &e) && e.ExitStatus == 1 && strings.Contains(e.Stderr, "Chain already exists") {
		return true, nil
	}
	return false, fmt.Errorf("creating chain %s in table %s: %w", chain, table, err)
}

// FlushChain is part of Interface.
func (r *runner) FlushChain(ctx context.Context, table Table, chain Chain) error {
	if _, err := r.run(ctx, "-t", string(table), "-F", string(chain)); err != nil {
		return fmt.Errorf("flushing chain %s in table %s: %w", chain, table, err)
	}
	return nil
}

// DeleteChain is part of Interface.
func (r *runner) DeleteChain(ctx context.Context, table Table, chain Chain) error {
	if _, err := r.run(ctx, "-t", string(table), "-X", string(chain)); err != nil {
		return fmt.Errorf("deleting chain %s in table %s: %w", chain, table, err)
	}
	return nil
}

// ChainExists is part of Interface. It lists the chain's first rule, which
// costs the same for any chain length.
func (r *runner) ChainExists(ctx context.Context, table Table, chain Chain) (bool, error) {
	_, err := r.run(ctx, "-t", string(table), "-S", string(chain), "1")
	if err == nil {
		return true, nil
	}
	if IsNotFound(err) {
		return false, nil
	}
	var e *Error
	if errors.As(err, &e) && e.ExitStatus == 1 && strings.Contains(e.Stderr, "is incompatible") {
		// iptables-nft 1.8.x says "chain `X' in table `t' is
		// incompatible, use 'nft' tool" both for a chain it cannot parse
		// and for one that does not exist; the save output tells them
		// apart.
		var buf bytes.Buffer
		if err := r.SaveInto(ctx, table, &buf); err != nil {
			return false, fmt.Errorf("checking for chain %s in table %s: %w", chain, table, err)
		}
		for _, c := range ChainsFromSave(buf.Bytes()) {
			if c == chain {
				return true, nil
			}
		}
		return false, nil
	}
	return false, fmt.Errorf("checking for chain %s in table %s: %w", chain, table, err)
}

// RuleExists is part of Interface. iptables -C compares rules as the
// kernel holds them, so "-s 10.0.0.1" equals "-s 10.0.0.1/32".
func (r *runner) RuleExists(ctx context.Context, table Table, chain Chain, args ...string) (bool, error) {
	if !r.feat.hasCheck {
		return false, fmt.Errorf("checking for a rule in chain %s: iptables %s cannot (-C needs %s or later)", chain, r.version, minCheckVersion)
	}
	full := append([]string{"-t", string(table), "-C", string(chain)}, args...)
	_, err := r.run(ctx, full...)
	if err == nil {
		return true, nil
	}
	// Exit status 1 is "no such rule" or "no such chain"; anything else
	// (2: bad arguments, 4: lock or kernel trouble) is an error, except a
	// jump to a chain that does not exist: no rule can jump there, so the
	// rule is not in the chain (a cleanup deleting jumps to chains that
	// are gone already relies on this).
	if exitStatus(err) == 1 || missingJumpTarget(err, args) {
		return false, nil
	}
	return false, fmt.Errorf("checking for a rule in chain %s of table %s: %w", chain, table, err)
}

// EnsureRule is part of Interface.
func (r *runner) EnsureRule(ctx context.Context, position RulePosition, table Table, chain Chain, args ...string) (bool, error) {
	if position != Append && position != Prepend {
		return false, fmt.Errorf("adding a rule to chain %s: unknown position %q", chain, position)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	exists, err := r.RuleExists(ctx, table, chain, args...)
	if err != nil || exists {
		return exists, err
	}
	full := append([]string{"-t", string(table), string(position), string(chain)}, args...)
	if _, err := r.run(ctx, full...); err != nil {
		return false, fmt.Errorf("adding a rule to chain %s of table %s: %w", chain, table, err)
	}
	return false, nil
}

// DeleteRule is part of Interface.
func (r *runner) DeleteRule(ctx context.Context, table Table, chain Chain, args ...string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	exists, err := r.RuleExists(ctx, table, chain, args...)
	if err != nil || !exists {
		return err
	}
	full := append([]string{"-t", string(table), "-D", string(chain)}, args...)
	if _, err := r.run(ctx, full...); err != nil {
		return fmt.Errorf("deleting a rule from chain %s of table %s: %w", chain, table, err)
	}
	return nil
}

// SaveInto is part of Interface. On error, buffer is left as it was.
func (r *runner) SaveInto(ctx context.Context, table Table, buffer *bytes.Buffer) error {
	args := []string{"-t", string(table)}
	klog.FromContext(ctx).V(4).Info("Running iptables-save", "command", r.cmds.save, "args", args)
	start := buffer.Len()
	var stderr bytes.Buffer
	cmd, run := r.command(ctx, r.cmds.save, args...)
	cmd.SetStdout(buffer)
	cmd.SetStderr(&stderr)
	if err := run(); err != nil {
		buffer.Truncate(start)
		return fmt.Errorf("saving table %s: %w", table, newError(r.cmds.save, args, err, stderr.String()))
	}
	return nil
}

// ListRules is part of Interface.
func (r *runner) ListRules(ctx context.Context, table Table, chain Chain, buffer *bytes.Buffer) error {
	out, err := r.run(ctx, "-t", string(table), "-S", string(chain))
	if err != nil {
		return fmt.Errorf("listing chain %s of table %s: %w", chain, table, err)
	}
	buffer.Write(out)
	return nil
}

// Restore is part of Interface.
func (r *runner) Restore(ctx context.Context, table Table, data []byte, flush FlushFlag, counters RestoreCountersFlag) error {
	if err := r.restore(ctx, []string{"-T", string(table)}, data, flush, counters); err != nil {
		return fmt.Errorf("restoring table %s: %w", table, err)
	}
	return nil
}

// RestoreAll is part of Interface.
func (r *runner) RestoreAll(ctx context.Context, data []byte, flush FlushFlag, counters RestoreCountersFlag) error {
	return r.restore(ctx, nil, data, flush, counters)
}

func (r *runner) restore(ctx context.Context, args []string, data []byte, flush FlushFlag, counters RestoreCountersFlag) error {
	full := append([]string(nil), r.feat.restoreWaitFlag...)
	full = append(full, args...)
	if !flush {
		full = append(full, "--noflush")
	}
	if counters {
		full = append(full, "--counters")
	}
	logger := klog.FromContext(ctx)
	if r.feat.restoreWaitFlag == nil && r.backend == BackendLegacy {
		// This iptables-restore cannot wait for the xtables lock, and
		// without the lock it would race other iptables commands; hold
		// the lock for it.
		lock, err := grabXtablesLock(ctx, r.clock, r.lockFile, r.feat.lockFile, r.lockWait)
		if err != nil {
			return &Error{Command: r.cmds.restore, Args: full, ExitStatus: -1, Err: err}
		}
		defer lock.Close()
	}
	logger.V(4).Info("Running iptables-restore", "command", r.cmds.restore, "args", full, "bytes", len(data))
	var stderr bytes.Buffer
	cmd, run := r.command(ctx, r.cmds.restore, full...)
	cmd.SetStdin(bytes.NewReader(data))
	cmd.SetStdout(&stderr)
	cmd.SetStderr(&stderr)
	if err := run(); err != nil {
		e := newError(r.cmds.restore, full, err, stderr.String())
		e.Line = restoreLine(e.Stderr)
		return e
	}
	return nil
}

// Monitor is part of Interface.
func (r *runner) Monitor(ctx context.Context, canary Chain, tables []Table, reloadFunc func(), interval time.Duration) {
	MonitorCanary(ctx, r, r.clock, canary, tables, reloadFunc, interval)
}

// Present is part of Interface.
func (r *runner) Present(ctx context.Context) error {
	ok, err := r.ChainExists(ctx, TableNAT, ChainPostrouting)
	if err != nil {
		return fmt.Errorf("iptables (%s, %s) is not usable: %w", r.backend, r.family, err)
	}
	if !ok {
		return fmt.Errorf("iptables (%s, %s) is not usable: the nat table has no POSTROUTING chain", r.backend, r.family)
	}
	return nil
}

// HasRandomFully is part of Interface.
func (r *runner) HasRandomFully() bool { return r.feat.randomFully }

// Family is part of Interface.
func (r *runner) Family() v1.IPFamily { return r.family }

// Backend is part of Interface.
func (r *runner) Backend() Backend { return r.backend }

// Version is part of Interface.
func (r *runner) Version() Version { return r.version }
