package iptablestest

import (
	"slices"
	"strings"

	"github.com/proxykit/proxykit/iptables"
	v1 "k8s.io/api/core/v1"
)

// table is one table of the fake kernel.
type table struct {
	name   iptables.Table
	chains map[iptables.Chain]*chain
	// refs counts, for each chain, the rules of the table that jump or go
	// to it, so that deleting a referenced chain is refused in O(1).
	refs map[iptables.Chain]int
}

// chain is one chain. A committed chain is never changed in place:
// transactions copy it first, so a failed restore leaves nothing behind.
type chain struct {
	name    iptables.Chain
	builtin bool
	// policy is ACCEPT or DROP for built-in chains, "-" for user chains.
	policy string
	rules  []*rule
	// owned is set while the rules slice is private to an uncommitted tx,
	// which may then change it in place.
	owned bool
	// Visit marks of the last graph check (see tx.checkGraph).
	epoch        uint64
	done, active uint8
}

// newTable returns table name as a freshly loaded kernel has it: built-in
// chains, empty, with policy ACCEPT.
func newTable(name iptables.Table) *table {
	t := &table{name: name, chains: map[iptables.Chain]*chain{}, refs: map[iptables.Chain]int{}}
	for _, c := range name.BuiltinChains() {
		t.chains[c] = &chain{name: c, builtin: true, policy: "ACCEPT"}
	}
	return t
}

// chainOrder returns the chains of the table as iptables-save lists them:
// built-in chains first, then user chains sorted by name.
func (t *table) chainOrder() []iptables.Chain {
	order := t.name.BuiltinChains()
	n := len(order)
	for name, c := range t.chains {
		if !c.builtin {
			order = append(order, name)
		}
	}
	slices.Sort(order[n:])
	return order
}

// dump appends the table in iptables-save format.
func (t *table) dump(b *strings.Builder) {
	order := t.chainOrder()
	b.WriteString("*")
	b.WriteString(string(t.name))
	b.WriteString("\n")
	for _, name := range order {
		b.WriteString(":")
		b.WriteString(string(name))
		b.WriteString(" ")
		b.WriteString(t.chains[name].policy)
		b.WriteString(" [0:0]\n")
	}
	for _, name := range order {
		for _, r := range t.chains[name].rules {
			b.WriteString("-A ")
			b.WriteString(string(name))
			if r.text != "" {
				b.WriteString(" ")
				b.WriteString(r.text)
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("COMMIT\n")
}

// fakeEnv is what a transaction needs to know about the fake.
type fakeEnv struct {
	family      v1.IPFamily
	backend     iptables.Backend
	randomFully bool
	setExists   func(string) bool
	// epoch numbers graph checks, so that chains can hold their visit
	// marks without a map.
	epoch uint64
}

// tx is a change to one table. When the table is new to this tx (a
// restore without --noflush, or a table never used before), the tx builds
// it directly and installs it at commit. Otherwise the tx keeps an overlay
// of the chains it changed, copied on first change, and merges it into the
// table at commit. Either way, abandoning a tx leaves the tables as they
// were, which is how a failed restore applies nothing of the failing table.
type tx struct {
	env  *fakeEnv
	name iptables.Table
	base *table
	// direct is set when base is new and private to this tx.
	direct bool
	// over holds the chains this tx changed; a nil chain is deleted.
	// It is nil when direct.
	over     map[iptables.Chain]*chain
	refDelta map[iptables.Chain]int
	// graphDirty is set when a rule that jumps, or a NAT target, was
	// added: commit then checks for loops and hooks.
	graphDirty bool
	scratch    *[]byte
	// parser and rEnv are reused for every rule.
	parser ruleParser
	rEnv   ruleEnv
}

// begin starts a change to table name of tables. With flush, the change
// starts from an empty table, as iptables-restore without --noflush does.
func begin(env *fakeEnv, tables map[iptables.Table]*table, name iptables.Table, flush bool, scratch *[]byte) *tx {
	x := &tx{env: env, name: name, base: tables[name], scratch: scratch}
	if x.base == nil || flush {
		fresh := newTable(name)
		// Without --noflush, legacy iptables-restore keeps the built-in
		// chains' policies; iptables-nft-restore recreates the table,
		// so they go back to ACCEPT.
		if x.base != nil && env.backend == iptables.BackendLegacy {
			for cn, c := range fresh.chains {
				c.policy = x.base.chains[cn].policy
			}
		}
		for _, c := range fresh.chains {
			c.owned = true
		}
		x.base, x.direct = fresh, true
	} else {
		x.over = map[iptables.Chain]*chain{}
		x.refDelta = map[iptables.Chain]int{}
	}
	x.rEnv = ruleEnv{family: env.family, table: name, randomFully: env.randomFully, chainState: x.chainState, setExists: env.setExists}
	return x
}

// get returns the chain as this tx sees it, or nil.
func (x *tx) get(name iptables.Chain) *chain {
	if !x.direct {
		if c, ok := x.over[name]; ok {
			return c
		}
	}
	return x.base.chains[name]
}

func (x *tx) chainState(name iptables.Chain) (exists, builtin bool) {
	c := x.get(name)
	return c != nil, c != nil && c.builtin
}

func (x *tx) refs(name iptables.Chain) int {
	return x.base.refs[name] + x.refDelta[name]
}

// mut returns the existing chain name for changing: the chain itself if
// this tx made it, else a copy (sharing the rules until own).
func (x *tx) mut(name iptables.Chain) *chain {
	if x.direct {
		return x.base.chains[name]
	}
	if c, ok := x.over[name]; ok {
		return c
	}
	c := *x.base.chains[name]
	c.owned = false
	x.over[name] = &c
	return &c
}

// put adds a new chain.
func (x *tx) put(c *chain) {
	c.owned = true
	if x.direct {
		x.base.chains[c.name] = c
	} else {
		x.over[c.name] = c
	}
}

// remove deletes a chain.
func (x *tx) remove(name iptables.Chain) {
	if x.direct {
		delete(x.base.chains, name)
	} else {
		x.over[name] = nil
	}
}

// own makes the chain's rules a private copy, before changing them in
// place. Appending does not need it: the committed slice never sees
// elements past its length.
func (c *chain) own() {
	if !c.owned {
		c.rules = slices.Clone(c.rules)
		c.owned = true
	}
}

func (x *tx) addRefs(r *rule, d int) {
	if k := r.target.kind; k == targetJump || k == targetGoto {
		if x.direct {
			if n := x.base.refs[r.target.chain] + d; n != 0 {
				x.base.refs[r.target.chain] = n
			} else {
				delete(x.base.refs, r.target.chain)
			}
		} else {
			x.refDelta[r.target.chain] += d
		}
		if d > 0 {
			x.graphDirty = true
		}
	}
	if d > 0 && allowedHooks(r.target.kind) != 0 {
		x.graphDirty = true
	}
}

// parse parses a rule for chain.
func (x *tx) parse(chainName iptables.Chain, args []string) (*rule, error) {
	x.rEnv.chain = chainName
	return parseRule(&x.parser, &x.rEnv, args, x.scratch)
}

// reservedChainName reports whether a chain may not be called name.
func reservedChainName(name string) bool {
	_, isTarget := targetKinds[name]
	return isTarget || otherTargets[name]
}

// checkNewChainName returns why a new chain cannot be called name.
func (x *tx) checkNewChainName(name iptables.Chain) error {
	switch {
	case name == "":
		return usagef("empty chain name")
	case len(name) > iptables.MaxChainNameLength:
		return usagef("Invalid chain name `%s' (%d chars max)", name, iptables.MaxChainNameLength)
	case reservedChainName(string(name)):
		return usagef("chain name may not clash with target name")
	case x.env.backend == iptables.BackendNFT && (name[0] == '-' || name[0] == '!'):
		return usagef("chain name not allowed to start with `%c'", name[0])
	}
	return nil
}

// validPolicy checks a policy given for chain c (nil: a new user chain).
func (x *tx) validPolicy(c *chain, policy string) error {
	builtin := c != nil && c.builtin
	switch policy {
	case "-":
		return nil
	case "ACCEPT", "DROP":
		if builtin || x.env.backend == iptables.BackendNFT {
			return nil
		}
		return failf("Bad built-in chain name")
	}
	return failf("Bad policy name")
}

// declare handles ":NAME POLICY": it creates the chain, or flushes it.
func (x *tx) declare(name iptables.Chain, policy string) error {
	c := x.get(name)
	if err := x.validPolicy(c, policy); err != nil {
		return err
	}
	if c == nil {
		if err := x.checkNewChainName(name); err != nil {
			return err
		}
		x.put(&chain{name: name, policy: "-"})
		return nil
	}
	x.flush(name)
	if c.builtin && policy != "-" {
		x.mut(name).policy = policy
	}
	return nil
}

// newChain handles -N.
func (x *tx) newChain(name iptables.Chain) error {
	if x.get(name) != nil {
		return failf("Chain already exists.")
	}
	if err := x.checkNewChainName(name); err != nil {
		return err
	}
	x.put(&chain{name: name, policy: "-"})
	return nil
}

// deleteChain handles -X CHAIN.
func (x *tx) deleteChain(name iptables.Chain) error {
	c := x.get(name)
	switch {
	case c == nil:
		return failf("No chain/target/match by that name.")
	case c.builtin:
		return failf("Can't delete built-in chain %s.", name)
	case x.refs(name) > 0:
		return failf("Too many links.")
	case len(c.rules) > 0:
		return failf("Directory not empty.")
	}
	x.remove(name)
	return nil
}

// deleteUserChains handles -X without a chain: every user chain.
func (x *tx) deleteUserChains() error {
	for _, name := range x.names() {
		if c := x.get(name); c != nil && !c.builtin {
			if err := x.deleteChain(name); err != nil {
				return err
			}
		}
	}
	return nil
}

// names returns every chain name the tx sees, sorted (deleted ones
// included; callers check get).
func (x *tx) names() []iptables.Chain {
	names := make([]iptables.Chain, 0, len(x.base.chains)+len(x.over))
	for name := range x.base.chains {
		names = append(names, name)
	}
	for name := range x.over { // nil when direct
		if _, ok := x.base.chains[name]; !ok {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// flush empties an existing chain.
func (x *tx) flush(name iptables.Chain) {
	c := x.mut(name)
	for _, r := range c.rules {
		x.addRefs(r, -1)
	}
	c.rules = nil
	c.owned = true
}

// flushChain handles -F CHAIN.
func (x *tx) flushChain(name iptables.Chain) error {
	if x.get(name) == nil {
		return failf("No chain/target/match by that name.")
	}
	x.flush(name)
	return nil
}

// flushAll handles -F without a chain.
func (x *tx) flushAll() {
	for _, name := range x.names() {
		if x.get(name) != nil {
			x.flush(name)
		}
	}
}

// setPolicy handles -P.
func (x *tx) setPolicy(name iptables.Chain, policy string) error {
	c := x.get(name)
	if c == nil || !c.builtin {
		return failf("Bad built-in chain name")
	}
	if policy != "ACCEPT" && policy != "DROP" {
		return failf("Bad policy name")
	}
	x.mut(name).policy = policy
	return nil
}

// existing returns the chain for a rule command, or an error.
func (x *tx) existing(name iptables.Chain) (*chain, error) {
	if x.get(name) == nil {
		return nil, failf("No chain/target/match by that name.")
	}
	return x.mut(name), nil
}

// insert puts r at position pos (1-based) of chain name; pos 0 appends.
func (x *tx) insert(name iptables.Chain, pos int, r *rule) error {
	c, err := x.existing(name)
	if err != nil {
		return err
	}
	switch {
	case pos == 0:
		c.rules = append(c.rules, r)
	case pos > len(c.rules)+1:
		return failf("Index of insertion too big.")
	default:
		c.own()
		c.rules = slices.Insert(c.rules, pos-1, r)
	}
	x.addRefs(r, 1)
	return nil
}

// deleteRule deletes the first rule of chain name equal to r, and reports
// whether there was one.
func (x *tx) deleteRule(name iptables.Chain, r *rule) (bool, error) {
	c := x.get(name)
	if c == nil {
		return false, failf("No chain/target/match by that name.")
	}
	i := slices.IndexFunc(c.rules, func(o *rule) bool { return o.text == r.text })
	if i < 0 {
		return false, nil
	}
	return true, x.deleteNum(name, i+1)
}

// deleteNum deletes rule number pos (1-based) of chain name.
func (x *tx) deleteNum(name iptables.Chain, pos int) error {
	c, err := x.existing(name)
	if err != nil {
		return err
	}
	if pos > len(c.rules) {
		return failf("Index of deletion too big.")
	}
	c.own()
	x.addRefs(c.rules[pos-1], -1)
	c.rules = slices.Delete(c.rules, pos-1, pos)
	return nil
}

// replace replaces rule number pos (1-based) of chain name by r.
func (x *tx) replace(name iptables.Chain, pos int, r *rule) error {
	c, err := x.existing(name)
	if err != nil {
		return err
	}
	if pos > len(c.rules) {
		return failf("Index of replacement too big.")
	}
	c.own()
	x.addRefs(c.rules[pos-1], -1)
	c.rules[pos-1] = r
	x.addRefs(r, 1)
	return nil
}

// commit checks the table as the kernel does when it is replaced, then
// installs the changes in tables.
func (x *tx) commit(tables map[iptables.Table]*table) error {
	if x.graphDirty {
		if err := x.checkGraph(); err != nil {
			return err
		}
	}
	t := x.base
	if x.direct {
		for _, c := range t.chains {
			c.owned = false
		}
	}
	for name, c := range x.over {
		if c == nil {
			delete(t.chains, name)
		} else {
			c.owned = false
			t.chains[name] = c
		}
	}
	for name, d := range x.refDelta {
		if n := t.refs[name] + d; n != 0 {
			t.refs[name] = n
		} else {
			delete(t.refs, name)
		}
	}
	tables[x.name] = t
	return nil
}

// checkGraph refuses what the kernel refuses when a table is replaced:
// a loop of jumps reachable from a built-in chain, and a NAT target
// reachable from a built-in chain whose hook it does not support. It
// walks each chain at most once per hook, so it costs O(rules); the
// visit marks live in the chains, under a fresh epoch.
func (x *tx) checkGraph() error {
	x.env.epoch++
	epoch := x.env.epoch
	var walk func(c *chain, hook uint8, from iptables.Chain) error
	walk = func(c *chain, hook uint8, from iptables.Chain) error {
		if c.epoch != epoch {
			c.epoch, c.done, c.active = epoch, 0, 0
		}
		if c.active&hook != 0 {
			return failf("loop of jumps through chain %s, reached from %s", c.name, from)
		}
		if c.done&hook != 0 {
			return nil
		}
		c.active |= hook
		for _, r := range c.rules {
			if mask := allowedHooks(r.target.kind); mask != 0 && mask&hook == 0 {
				return failf("%s target in chain %s reached from %s (allowed only from %s): -A %s %s",
					r.target.name, c.name, from, hookNames(mask), c.name, r.text)
			}
			if k := r.target.kind; k == targetJump || k == targetGoto {
				if err := walk(x.get(r.target.chain), hook, from); err != nil {
					return err
				}
			}
		}
		c.active &^= hook
		c.done |= hook
		return nil
	}
	for _, b := range x.name.BuiltinChains() {
		if err := walk(x.get(b), hookOf(b), b); err != nil {
			return err
		}
	}
	return nil
}
