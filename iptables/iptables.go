package iptables

import (
	"bytes"
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
)

// Interface runs iptables, iptables-restore and iptables-save for one IP
// family and one backend (legacy or nft). Implementations are safe for
// concurrent use. The real one comes from [New]; package
// github.com/proxykit/proxykit/iptables/iptablestest has an in-memory Fake.
//
// Every method that runs a command takes a context: cancelling it kills the
// command, and the logger in it (klog.FromContext) receives the commands
// run, at verbosity 4 and above.
type Interface interface {
	// EnsureChain creates chain in table if it does not exist. It reports
	// whether the chain existed already; that is not an error.
	EnsureChain(ctx context.Context, table Table, chain Chain) (existed bool, err error)

	// FlushChain removes every rule of chain. A chain that does not exist
	// is an error for which [IsNotFound] is true.
	FlushChain(ctx context.Context, table Table, chain Chain) error

	// DeleteChain deletes chain, which must be empty and not referenced by
	// any rule. A chain that does not exist is an error for which
	// [IsNotFound] is true; built-in chains cannot be deleted.
	DeleteChain(ctx context.Context, table Table, chain Chain) error

	// ChainExists reports whether chain exists in table. A missing chain
	// (or table) is (false, nil); an error means the question could not be
	// answered.
	ChainExists(ctx context.Context, table Table, chain Chain) (bool, error)

	// EnsureRule adds the rule made of args (the words after "-A CHAIN",
	// unquoted: one slice element per argument) to chain, at the end for
	// [Append] or at the start for [Prepend], unless an equal rule is in
	// the chain already. It reports whether the rule existed. The chain
	// must exist.
	EnsureRule(ctx context.Context, position RulePosition, table Table, chain Chain, args ...string) (existed bool, err error)

	// DeleteRule deletes the first rule of chain equal to args, if there is
	// one. A missing rule, a missing chain, or a rule jumping to a chain
	// that does not exist (so it cannot be there) is not an error: after
	// DeleteRule returns nil, the rule is not in the chain.
	DeleteRule(ctx context.Context, table Table, chain Chain, args ...string) error

	// RuleExists reports whether chain holds a rule equal to args. A
	// missing chain is (false, nil), and so is a rule that jumps to a chain
	// that does not exist, which iptables itself refuses to look for.
	RuleExists(ctx context.Context, table Table, chain Chain, args ...string) (bool, error)

	// SaveInto appends the iptables-save output for table to buffer:
	// "*table", chain declarations, "-A" rules and "COMMIT".
	SaveInto(ctx context.Context, table Table, buffer *bytes.Buffer) error

	// ListRules appends the rules of one chain to buffer as "iptables -S
	// CHAIN" prints them: "-N CHAIN" (or "-P CHAIN POLICY" for a built-in
	// chain), then one "-A CHAIN ..." line per rule. It is much cheaper
	// than SaveInto on the nft backend, which lists only that chain; the
	// legacy backend reads the whole table either way. A chain that does
	// not exist is an error (the message depends on the backend: use
	// ChainExists to tell). On error, buffer is left as it was.
	ListRules(ctx context.Context, table Table, chain Chain, buffer *bytes.Buffer) error

	// Restore runs iptables-restore for table alone: sections of data for
	// other tables are skipped. data is iptables-save format. With
	// [FlushTables] the table is emptied first (user chains not declared in
	// data are deleted); with [NoFlushTables] only the chains that data
	// declares (":CHAIN ...") are flushed, and the rest is left alone. With
	// [RestoreCounters] the "[packets:bytes]" counters in data are applied.
	// The table's changes are applied atomically: on error, nothing of
	// that table changed. The error is an *[Error] carrying the line
	// iptables-restore complained about.
	Restore(ctx context.Context, table Table, data []byte, flush FlushFlag, counters RestoreCountersFlag) error

	// RestoreAll is [Interface.Restore] for every table in data. Each table
	// is committed at its COMMIT line, as iptables-restore does: when a
	// later table fails, the tables before it stay applied.
	RestoreAll(ctx context.Context, data []byte, flush FlushFlag, counters RestoreCountersFlag) error

	// Monitor watches for other programs deleting or flushing rules (a
	// firewalld reload, "iptables -F", "iptables -X") by keeping a canary
	// chain, holding one rule, in each of tables. Every interval it checks
	// the canaries; when one has been deleted or flushed it waits briefly
	// for the others to go too (a reload empties tables one after the
	// other), recreates them, and calls reloadFunc, which should resync
	// the caller's rules. Monitor blocks until ctx is done; run it in its
	// own goroutine. If tables is empty or interval is not positive it
	// logs an error and returns at once. Errors while checking (for
	// example a failed exec) are logged and never trigger reloadFunc.
	Monitor(ctx context.Context, canary Chain, tables []Table, reloadFunc func(), interval time.Duration)

	// Present returns nil if iptables can be used here: the binaries run
	// and the kernel has the nat table. Otherwise it returns an error
	// saying why.
	Present(ctx context.Context) error

	// HasRandomFully reports whether the MASQUERADE and SNAT targets accept
	// --random-fully (iptables 1.6.2 and later).
	HasRandomFully() bool

	// Family returns the IP family this Interface manages,
	// v1.IPv4Protocol or v1.IPv6Protocol.
	Family() v1.IPFamily

	// Backend returns the backend this Interface runs: [BackendLegacy] or
	// [BackendNFT].
	Backend() Backend

	// Version returns the iptables version that "iptables --version"
	// reported when the Interface was made.
	Version() Version
}

// Table is an iptables table name: "filter", "nat", "mangle", "raw" or
// "security".
type Table string

// The tables iptables knows.
const (
	TableFilter   Table = "filter"
	TableNAT      Table = "nat"
	TableMangle   Table = "mangle"
	TableRaw      Table = "raw"
	TableSecurity Table = "security"
)

// tables is every table, in the order proxykit's dumps use.
var tables = []Table{TableFilter, TableNAT, TableMangle, TableRaw, TableSecurity}

// Tables returns the five iptables tables, filter first. The slice is new
// on every call.
func Tables() []Table { return append([]Table(nil), tables...) }

// BuiltinChains returns the built-in chains of the table, in the order
// iptables-save lists them, or nil for an unknown table. The slice is new
// on every call.
func (t Table) BuiltinChains() []Chain {
	switch t {
	case TableFilter, TableSecurity:
		return []Chain{ChainInput, ChainForward, ChainOutput}
	case TableNAT:
		return []Chain{ChainPrerouting, ChainInput, ChainOutput, ChainPostrouting}
	case TableMangle:
		return []Chain{ChainPrerouting, ChainInput, ChainForward, ChainOutput, ChainPostrouting}
	case TableRaw:
		return []Chain{ChainPrerouting, ChainOutput}
	}
	return nil
}

// Valid reports whether t is one of the five tables iptables knows.
func (t Table) Valid() bool { return t.BuiltinChains() != nil }

// Chain is an iptables chain name. User-defined chain names are at most
// [MaxChainNameLength] bytes long.
type Chain string

// The built-in chains.
const (
	ChainPrerouting  Chain = "PREROUTING"
	ChainInput       Chain = "INPUT"
	ChainForward     Chain = "FORWARD"
	ChainOutput      Chain = "OUTPUT"
	ChainPostrouting Chain = "POSTROUTING"
)

// MaxChainNameLength is the longest chain name iptables accepts, in bytes.
const MaxChainNameLength = 28

// IsBuiltin reports whether c is a built-in chain of table t.
func (c Chain) IsBuiltin(t Table) bool {
	switch c {
	case ChainPrerouting, ChainInput, ChainForward, ChainOutput, ChainPostrouting:
	default:
		return false
	}
	for _, b := range t.BuiltinChains() {
		if b == c {
			return true
		}
	}
	return false
}

// RulePosition says where [Interface.EnsureRule] adds a rule.
type RulePosition string

const (
	// Prepend inserts the rule before the chain's first rule ("-I").
	Prepend RulePosition = "-I"
	// Append adds the rule after the chain's last rule ("-A").
	Append RulePosition = "-A"
)

// FlushFlag says whether a restore empties the tables it touches first.
type FlushFlag bool

const (
	// FlushTables empties each restored table first: its user chains are
	// deleted and its built-in chains flushed (iptables-restore without
	// --noflush).
	FlushTables FlushFlag = true
	// NoFlushTables leaves alone the chains that the input does not
	// declare (iptables-restore --noflush).
	NoFlushTables FlushFlag = false
)

// RestoreCountersFlag says whether a restore applies the packet and byte
// counters in its input.
type RestoreCountersFlag bool

const (
	// RestoreCounters applies the "[packets:bytes]" counters of the input
	// (iptables-restore --counters).
	RestoreCounters RestoreCountersFlag = true
	// NoRestoreCounters ignores them.
	NoRestoreCounters RestoreCountersFlag = false
)
