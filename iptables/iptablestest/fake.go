package iptablestest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"

	"github.com/proxykit/proxykit/iptables"
)

// Fake is an in-memory iptables that implements [iptables.Interface]. It
// parses what it is given as the real binaries do, refuses what they (or
// the kernel behind them) refuse with the same kind of *iptables.Error, and
// keeps rules in iptables-save's canonical form, so [Fake.Dump] reads like
// iptables-save output. A Fake is safe for concurrent use.
//
// A new Fake has no tables. A table comes into being, with its built-in
// chains empty and accepting, when a command or restore first changes it.
type Fake struct {
	mu      sync.Mutex
	env     fakeEnv
	family  v1.IPFamily
	version iptables.Version
	clock   clock.Clock
	tables  map[iptables.Table]*table
	// scratch is reused to build rule text; guarded by mu.
	scratch []byte
	words   []string
	// maxBranches bounds Trace; a field so tests can lower it.
	maxBranches int
	// sets decides Trace's set matches, when given (WithIPSetFake);
	// setRefs are the references the rules hold on them.
	sets    IPSets
	setRefs map[string]int
}

var _ iptables.Interface = (*Fake)(nil)

// Option configures a Fake.
type Option func(*Fake)

// WithBackend makes the Fake behave like backend b where the two backends
// differ, and report it from Backend. The default is
// [iptables.BackendNFT]. The differences it models: legacy refuses a
// policy on a user chain (":FOO ACCEPT [0:0]"), which nft ignores; nft
// refuses chain names starting with "-" or "!", which legacy allows; and a
// restore without --noflush keeps the built-in chains' policies with
// legacy but resets them to ACCEPT with nft.
func WithBackend(b iptables.Backend) Option {
	return func(f *Fake) { f.env.backend = b }
}

// WithVersion makes the Fake report version v (default 1.8.9) and have
// its features: before 1.6.2, HasRandomFully is false and --random-fully
// is an unknown option.
func WithVersion(v iptables.Version) Option {
	return func(f *Fake) { f.version = v }
}

// WithClock sets the clock Monitor waits on (default: the real clock).
func WithClock(c clock.Clock) Option {
	return func(f *Fake) { f.clock = c }
}

// WithIPSets tells the Fake which ipsets exist, for "-m set --match-set
// NAME": the kernel refuses a rule naming a set that does not exist, and so
// does the Fake. exists may be called with the Fake's lock held; it must
// not call the Fake. Without this option no set exists.
func WithIPSets(exists func(name string) bool) Option {
	return func(f *Fake) { f.env.setExists = exists }
}

// IPSets is what the Fake needs to know of ipsets to refuse and to trace
// "-m set --match-set" rules; [github.com/proxykit/proxykit/ipset/ipsettest.Fake]
// implements it. Its methods are called with the Fake's lock held and must
// not call the Fake.
type IPSets interface {
	// HasSet reports whether a set named name exists.
	HasSet(name string) bool
	// MatchPacket reports whether a packet matches the set name as
	// "-m set --match-set name DIRS" decides, given, for each direction
	// of DIRS in order, the packet's address and port on that side, and
	// its transport protocol (empty for one without ports). It fails if
	// the set does not exist.
	MatchPacket(name string, protocol v1.Protocol, dims []netip.AddrPort) (bool, error)
	// Reference adds a reference to the set name, which may then not be
	// destroyed; it fails if the set does not exist.
	Reference(name string) error
	// Unreference removes one reference added by Reference.
	Unreference(name string)
}

// WithIPSetFake gives the Fake the ipsets of sets, usually an ipset fake
// that the code under test fills: a rule naming a set that sets does not
// have is refused, as the kernel refuses it; each rule that names a set
// holds a reference to it (Reference and Unreference, as rules come and
// go), so that destroying a set a rule still uses fails as in the kernel;
// and [Fake.Trace] decides each "-m set" match by asking sets, with the
// packet's addresses and ports where the rule meets it (after any DNAT
// before it). It replaces [WithIPSets].
func WithIPSetFake(sets IPSets) Option {
	return func(f *Fake) {
		f.env.setExists = sets.HasSet
		f.sets = sets
	}
}

// NewFake returns an empty IPv4 Fake.
func NewFake(opts ...Option) *Fake {
	return newFake(v1.IPv4Protocol, opts)
}

// NewIPv6Fake returns an empty IPv6 Fake (ip6tables).
func NewIPv6Fake(opts ...Option) *Fake {
	return newFake(v1.IPv6Protocol, opts)
}

func newFake(p v1.IPFamily, opts []Option) *Fake {
	f := &Fake{
		family:  p,
		version: iptables.Version{Major: 1, Minor: 8, Patch: 9},
		clock:   clock.RealClock{},
		tables:  map[iptables.Table]*table{},
		env:     fakeEnv{family: p, backend: iptables.BackendNFT},

		maxBranches: maxBranches,
	}
	for _, o := range opts {
		o(f)
	}
	f.env.randomFully = f.version.AtLeast(iptables.Version{Major: 1, Minor: 6, Patch: 2})
	return f
}

func (f *Fake) binary(suffix string) string {
	if f.family == v1.IPv6Protocol {
		return "ip6tables" + suffix
	}
	return "iptables" + suffix
}

// commandError turns an error from a tx into the *iptables.Error the
// iptables binary would have returned for args.
func (f *Fake) commandError(args []string, err error) error {
	status := 1
	var ce *cmdError
	if errors.As(err, &ce) {
		status = ce.status
	}
	prefix := "iptables: "
	if status != 1 {
		prefix = fmt.Sprintf("%s v%s (%s): ", f.binary(""), f.version, f.modeName())
	}
	return &iptables.Error{Command: f.binary(""), Args: args, ExitStatus: status, Stderr: prefix + err.Error()}
}

func (f *Fake) modeName() string {
	if f.env.backend == iptables.BackendLegacy {
		return "legacy"
	}
	return "nf_tables"
}

func (f *Fake) tableError(command string, args []string, t iptables.Table) error {
	return &iptables.Error{Command: command, Args: args, ExitStatus: 3,
		Stderr: fmt.Sprintf("%s v%s (%s): can't initialize iptables table `%s': Table does not exist (do you need to insmod?)", command, f.version, f.modeName(), t)}
}

// change runs fn on a tx of table and commits it, the way one iptables
// command changes the kernel. The caller holds f.mu.
func (f *Fake) change(t iptables.Table, args []string, fn func(*tx) error) error {
	if !t.Valid() {
		return f.tableError(f.binary(""), args, t)
	}
	x := begin(&f.env, f.tables, t, false, &f.scratch)
	if err := fn(x); err != nil {
		return f.commandError(args, err)
	}
	if err := x.commit(f.tables); err != nil {
		return f.commandError(args, err)
	}
	f.referenceSets()
	return nil
}

// referenceSets brings the references the Fake holds on the ipsets of
// WithIPSetFake in line with the rules it holds now: one per rule that
// names a set. It costs O(rules), and nothing without WithIPSetFake. The
// caller holds f.mu.
func (f *Fake) referenceSets() {
	if f.sets == nil {
		return
	}
	now := map[string]int{}
	for _, t := range f.tables {
		for _, c := range t.chains {
			for _, r := range c.rules {
				for _, m := range r.matches {
					if sm, ok := m.(*setMatch); ok {
						now[sm.name]++
					}
				}
			}
		}
	}
	for name, n := range f.setRefs {
		for ; n > now[name]; n-- {
			f.sets.Unreference(name)
		}
	}
	held := make(map[string]int, len(now))
	for name, n := range now {
		have := f.setRefs[name]
		held[name] = min(have, n)
		for ; have < n; have++ {
			// Only a set destroyed since the rule was checked fails;
			// the rule then holds nothing on it.
			if f.sets.Reference(name) == nil {
				held[name]++
			}
		}
	}
	f.setRefs = held
}

// EnsureChain is part of Interface.
func (f *Fake) EnsureChain(ctx context.Context, t iptables.Table, c iptables.Chain) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	existed := false
	err := f.change(t, []string{"-t", string(t), "-N", string(c)}, func(x *tx) error {
		if x.get(c) != nil {
			existed = true
			return nil
		}
		return x.newChain(c)
	})
	return existed, err
}

// FlushChain is part of Interface.
func (f *Fake) FlushChain(ctx context.Context, t iptables.Table, c iptables.Chain) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.change(t, []string{"-t", string(t), "-F", string(c)}, func(x *tx) error {
		return x.flushChain(c)
	})
}

// DeleteChain is part of Interface.
func (f *Fake) DeleteChain(ctx context.Context, t iptables.Table, c iptables.Chain) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.change(t, []string{"-t", string(t), "-X", string(c)}, func(x *tx) error {
		return x.deleteChain(c)
	})
}

// ChainExists is part of Interface.
func (f *Fake) ChainExists(ctx context.Context, t iptables.Table, c iptables.Chain) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !t.Valid() {
		return false, f.tableError(f.binary(""), []string{"-t", string(t), "-S", string(c), "1"}, t)
	}
	tbl := f.tables[t]
	if tbl == nil {
		return c.IsBuiltin(t), nil
	}
	return tbl.chains[c] != nil, nil
}

// findRule parses args as a rule of chain c in table t and returns whether
// the chain exists and the index of the first equal rule (-1 if none).
// The caller holds f.mu.
func (f *Fake) findRule(t iptables.Table, c iptables.Chain, cmdArgs []string, args []string) (bool, int, error) {
	if !t.Valid() {
		return false, -1, f.tableError(f.binary(""), cmdArgs, t)
	}
	x := begin(&f.env, f.tables, t, false, &f.scratch)
	ch := x.get(c)
	if ch == nil {
		return false, -1, nil
	}
	r, err := x.parse(c, args)
	if ce := (*cmdError)(nil); errors.As(err, &ce) && ce.missingChain {
		return true, -1, nil
	}
	if err != nil {
		return true, -1, f.commandError(cmdArgs, err)
	}
	return true, slices.IndexFunc(ch.rules, func(o *rule) bool { return o.text == r.text }), nil
}

// RuleExists is part of Interface. Rules are compared in iptables-save's
// canonical form, so "-p tcp --dport 80" equals "-p tcp -m tcp --dport 80"
// and "-s 10.0.0.1" equals "-s 10.0.0.1/32", as with iptables -C.
func (f *Fake) RuleExists(ctx context.Context, t iptables.Table, c iptables.Chain, args ...string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, i, err := f.findRule(t, c, append([]string{"-t", string(t), "-C", string(c)}, args...), args)
	return i >= 0, err
}

// EnsureRule is part of Interface.
func (f *Fake) EnsureRule(ctx context.Context, pos iptables.RulePosition, t iptables.Table, c iptables.Chain, args ...string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cmdArgs := append([]string{"-t", string(t), string(pos), string(c)}, args...)
	if pos != iptables.Append && pos != iptables.Prepend {
		return false, fmt.Errorf("adding a rule to chain %s: unknown position %q", c, pos)
	}
	_, i, err := f.findRule(t, c, cmdArgs, args)
	if err != nil || i >= 0 {
		return i >= 0, err
	}
	return false, f.change(t, cmdArgs, func(x *tx) error {
		r, err := x.parse(c, args)
		if err != nil {
			return err
		}
		at := 0
		if pos == iptables.Prepend {
			at = 1
		}
		return x.insert(c, at, r)
	})
}

// DeleteRule is part of Interface.
func (f *Fake) DeleteRule(ctx context.Context, t iptables.Table, c iptables.Chain, args ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	cmdArgs := append([]string{"-t", string(t), "-D", string(c)}, args...)
	_, i, err := f.findRule(t, c, cmdArgs, args)
	if err != nil || i < 0 {
		return err
	}
	return f.change(t, cmdArgs, func(x *tx) error { return x.deleteNum(c, i+1) })
}

// SaveInto is part of Interface. A table that was never changed is saved
// as the kernel would load it: built-in chains, empty.
func (f *Fake) SaveInto(ctx context.Context, t iptables.Table, buffer *bytes.Buffer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !t.Valid() {
		return f.tableError(f.binary("-save"), []string{"-t", string(t)}, t)
	}
	tbl := f.tables[t]
	if tbl == nil {
		tbl = newTable(t)
	}
	var b strings.Builder
	tbl.dump(&b)
	buffer.WriteString(b.String())
	return nil
}

// ListRules is part of Interface. The rules are printed as the Fake
// holds them, which is how iptables-save prints them. A missing chain is
// the legacy binary's error, for which iptables.IsNotFound is true.
func (f *Fake) ListRules(ctx context.Context, t iptables.Table, c iptables.Chain, buffer *bytes.Buffer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	args := []string{"-t", string(t), "-S", string(c)}
	if !t.Valid() {
		return f.tableError(f.binary(""), args, t)
	}
	var ch *chain
	if tbl := f.tables[t]; tbl != nil {
		ch = tbl.chains[c]
	} else if c.IsBuiltin(t) {
		ch = &chain{name: c, builtin: true, policy: "ACCEPT"}
	}
	if ch == nil {
		return &iptables.Error{Command: f.binary(""), Args: args, ExitStatus: 1, Stderr: "iptables: No chain/target/match by that name."}
	}
	var b strings.Builder
	if ch.builtin {
		b.WriteString("-P " + string(c) + " " + ch.policy + "\n")
	} else {
		b.WriteString("-N " + string(c) + "\n")
	}
	for _, r := range ch.rules {
		b.WriteString("-A " + string(c))
		if r.text != "" {
			b.WriteString(" " + r.text)
		}
		b.WriteString("\n")
	}
	buffer.WriteString(b.String())
	return nil
}

// Restore is part of Interface. Counters in data are checked for syntax
// and otherwise ignored: the Fake counts nothing.
func (f *Fake) Restore(ctx context.Context, t iptables.Table, data []byte, flush iptables.FlushFlag, counters iptables.RestoreCountersFlag) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	args := restoreArgs{only: t, noflush: !bool(flush), counters: bool(counters)}
	if !t.Valid() {
		return f.tableError(f.binary("-restore"), args.list(), t)
	}
	// A failed restore may have committed tables before the failing one.
	defer f.referenceSets()
	return f.restore(f.tables, data, args)
}

// RestoreAll is part of Interface. As with the real iptables-restore, each
// table is committed at its COMMIT line: when a later table fails, earlier
// ones stay applied.
func (f *Fake) RestoreAll(ctx context.Context, data []byte, flush iptables.FlushFlag, counters iptables.RestoreCountersFlag) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	// A failed restore may have committed tables before the failing one.
	defer f.referenceSets()
	return f.restore(f.tables, data, restoreArgs{noflush: !bool(flush), counters: bool(counters)})
}

// restore applies data to tables. The caller holds f.mu.
func (f *Fake) restore(tables map[iptables.Table]*table, data []byte, args restoreArgs) error {
	rs := restorer{env: &f.env, tables: tables, args: args, command: f.binary("-restore"), scratch: &f.scratch, words: f.words}
	err := rs.restore(data)
	// Keep the slice for the next restore, but not the input it points
	// into.
	clear(rs.words)
	f.words = rs.words[:0]
	return err
}

// Monitor is part of Interface. It runs [iptables.MonitorCanary] against
// the Fake, on the clock given with [WithClock]: flushing or deleting the
// canary through any Fake method or restore triggers reloadFunc.
func (f *Fake) Monitor(ctx context.Context, canary iptables.Chain, tables []iptables.Table, reloadFunc func(), interval time.Duration) {
	iptables.MonitorCanary(ctx, f, f.clock, canary, tables, reloadFunc, interval)
}

// Present is part of Interface; the Fake is always present.
func (f *Fake) Present(ctx context.Context) error { return nil }

// HasRandomFully is part of Interface: true unless [WithVersion] gave a
// version before 1.6.2.
func (f *Fake) HasRandomFully() bool { return f.env.randomFully }

// Family is part of Interface.
func (f *Fake) Family() v1.IPFamily { return f.family }

// Backend is part of Interface: the backend given with [WithBackend], nft
// by default.
func (f *Fake) Backend() iptables.Backend { return f.env.backend }

// Version is part of Interface.
func (f *Fake) Version() iptables.Version { return f.version }

// Dump returns every table the Fake holds in iptables-save format, tables
// in the order filter, nat, mangle, raw, security, each with its built-in
// chains first and user chains sorted by name, counters always [0:0], and
// no "# Generated by" comments, so that it can be compared with golden
// text. It is "" for a Fake with no tables. [Fake.ParseDump] reads it
// back.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, t := range iptables.Tables() {
		if tbl := f.tables[t]; tbl != nil {
			tbl.dump(&b)
		}
	}
	return b.String()
}

// ParseDump replaces everything the Fake holds with the tables in data, in
// iptables-save format (as [Fake.Dump] or iptables-save write it). It is
// all or nothing: on error the Fake is unchanged. The error is an
// *iptables.Error naming the offending line.
func (f *Fake) ParseDump(data string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	tables := map[iptables.Table]*table{}
	if err := f.restore(tables, []byte(data), restoreArgs{}); err != nil {
		return err
	}
	f.tables = tables
	f.referenceSets()
	return nil
}

// Chains returns the chains of table t as iptables-save lists them
// (built-in chains first, then user chains by name), or nil if the table
// was never changed.
func (f *Fake) Chains(t iptables.Table) []iptables.Chain {
	f.mu.Lock()
	defer f.mu.Unlock()
	if tbl := f.tables[t]; tbl != nil {
		return tbl.chainOrder()
	}
	return nil
}

// Rules returns the rules of chain c of table t, each in iptables-save's
// canonical form without the leading "-A CHAIN", or nil if the chain does
// not exist. An existing empty chain gives an empty, non-nil slice.
func (f *Fake) Rules(t iptables.Table, c iptables.Chain) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	tbl := f.tables[t]
	if tbl == nil || tbl.chains[c] == nil {
		return nil
	}
	rules := make([]string, 0, len(tbl.chains[c].rules))
	for _, r := range tbl.chains[c].rules {
		rules = append(rules, r.text)
	}
	return rules
}
