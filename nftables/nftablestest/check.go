package nftablestest

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"
)

var (
	elementLine = regexp.MustCompile(`^(add|delete) element (\S+) (\S+) (\S+) \{ (.*?)(?: comment "[^"]*")?(?: : (.*))? \}$`)
	objectLine  = regexp.MustCompile(`^(add|flush|delete) (chain|map|set) (\S+) (\S+) (\S+)`)
)

// CheckTransaction reports what in tx the kernel would refuse and
// knftables.Fake (v0.0.21) accepts, given fake's state before tx:
//
//   - adding a map element whose key is there with another value (the
//     kernel refuses it even with "add"; delete it first);
//   - deleting a chain that still holds rules (flush it first);
//   - leaving a rule or a map element that jumps to, or a rule that uses,
//     a chain, set or map that the transaction deleted.
//
// Call it before fake.Run(tx) in tests, so that a transaction that passes
// on the Fake also passes in the kernel. It runs tx on a copy of fake's
// state and leaves fake as it was.
func CheckTransaction(fake *knftables.Fake, tx *knftables.Transaction) error {
	text := tx.String()
	if i := strings.Index(text, "# ERROR"); i >= 0 {
		return fmt.Errorf("invalid transaction: %s", strings.TrimSpace(text[i:]))
	}

	// What each map holds, and which chains hold rules, as the
	// transaction goes.
	fake.RLock()
	values := map[string]map[string]string{} // "family table map" -> key -> value
	hasRules := map[string]bool{}            // "family table chain"
	for family, tables := range fake.Tables {
		for tname, t := range tables {
			for mname, m := range t.Maps {
				vals := map[string]string{}
				for _, e := range m.Elements {
					vals[strings.Join(e.Key, " . ")] = strings.Join(e.Value, " . ")
				}
				values[fmt.Sprintf("%s %s %s", family, tname, mname)] = vals
			}
			for cname, c := range t.Chains {
				hasRules[fmt.Sprintf("%s %s %s", family, tname, cname)] = len(c.Rules) > 0
			}
		}
	}
	scratch := cloneFake(fake)
	fake.RUnlock()

	for n, line := range strings.Split(strings.TrimSpace(text), "\n") {
		if m := elementLine.FindStringSubmatch(line); m != nil {
			id := m[2] + " " + m[3] + " " + m[4]
			vals := values[id]
			if vals == nil || m[6] == "" && m[1] == "add" {
				continue // a set, or a map made in this transaction
			}
			switch m[1] {
			case "add":
				if old, ok := vals[m[5]]; ok && old != m[6] {
					return fmt.Errorf("line %d: %q: the element is there with value %q; the kernel refuses to change it with add", n+1, line, old)
				}
				vals[m[5]] = m[6]
			case "delete":
				delete(vals, m[5])
			}
			continue
		}
		if m := objectLine.FindStringSubmatch(line); m != nil {
			id := m[3] + " " + m[4] + " " + m[5]
			switch m[2] + " " + m[1] {
			case "map add":
				if values[id] == nil {
					values[id] = map[string]string{}
				}
			case "map flush", "map delete":
				values[id] = map[string]string{}
			case "chain flush":
				hasRules[id] = false
			case "chain delete":
				if hasRules[id] {
					return fmt.Errorf("line %d: %q: the chain holds rules; the kernel refuses to delete it before a flush", n+1, line)
				}
			}
			continue
		}
		if strings.HasPrefix(line, "add rule ") || strings.HasPrefix(line, "insert rule ") {
			if f := strings.Fields(line); len(f) > 5 {
				hasRules[f[2]+" "+f[3]+" "+f[4]] = true
			}
		}
	}

	// The references left after the transaction.
	if err := scratch.Run(context.Background(), tx); err != nil {
		return err
	}
	for family, tables := range scratch.Tables {
		for tname, t := range tables {
			for cname, c := range t.Chains {
				for _, r := range c.Rules {
					if err := checkRefs(t, r.Rule); err != nil {
						return fmt.Errorf("after the transaction, %s %s chain %s rule %q: %w", family, tname, cname, r.Rule, err)
					}
				}
			}
			for mname, m := range t.Maps {
				for _, e := range m.Elements {
					if err := checkRefs(t, strings.Join(e.Value, " ")); err != nil {
						return fmt.Errorf("after the transaction, %s %s map %s element %q: %w", family, tname, mname, e.Key, err)
					}
				}
			}
		}
	}
	return nil
}

func checkRefs(t *knftables.FakeTable, text string) error {
	words := strings.Fields(text)
	for i, w := range words {
		switch {
		case (w == "goto" || w == "jump") && i+1 < len(words):
			if t.Chains[words[i+1]] == nil {
				return fmt.Errorf("no chain %q", words[i+1])
			}
		case w == "@" && i+1 < len(words), strings.HasPrefix(w, "@") && len(w) > 1:
			name := strings.TrimPrefix(w, "@")
			if name == "" {
				name = words[i+1]
			}
			if t.Sets[name] == nil && t.Maps[name] == nil {
				return fmt.Errorf("no set or map %q", name)
			}
		}
	}
	return nil
}

// defaults returns the family and table fake was made for, which the
// copy needs to read transactions whose objects leave them out; both are
// empty for a Fake made without them.
// cloneFake returns a Fake with a copy of fake's tables, which the
// caller has read-locked, for a transaction to run on without changing
// fake. It copies rather than parsing fake's Dump back, because
// knftables.Fake's ParseDump (v0.0.21) cannot read a rule with a quoted
// string in it, such as an interface name (iifname "cni0").
func cloneFake(fake *knftables.Fake) *knftables.Fake {
	family, table := defaults(fake)
	scratch := knftables.NewFake(family, table)
	scratch.Tables = map[knftables.Family]map[string]*knftables.FakeTable{}
	for f, tables := range fake.Tables {
		if scratch.Tables[f] == nil {
			scratch.Tables[f] = map[string]*knftables.FakeTable{}
		}
		for name, t := range tables {
			c := &knftables.FakeTable{Table: t.Table, Flowtables: map[string]*knftables.FakeFlowtable{}, Counters: map[string]*knftables.FakeCounter{},
				Chains: map[string]*knftables.FakeChain{}, Sets: map[string]*knftables.FakeSet{}, Maps: map[string]*knftables.FakeMap{}}
			maps.Copy(c.Flowtables, t.Flowtables)
			maps.Copy(c.Counters, t.Counters)
			for n, ch := range t.Chains {
				c.Chains[n] = &knftables.FakeChain{Chain: ch.Chain, Rules: slices.Clone(ch.Rules)}
			}
			for n, set := range t.Sets {
				c.Sets[n] = &knftables.FakeSet{Set: set.Set, Elements: slices.Clone(set.Elements)}
			}
			for n, m := range t.Maps {
				c.Maps[n] = &knftables.FakeMap{Map: m.Map, Elements: slices.Clone(m.Elements)}
			}
			scratch.Tables[f][name] = c
			if f == family && name == table {
				scratch.Table = c
			}
		}
	}
	return scratch
}

func defaults(fake *knftables.Fake) (knftables.Family, string) {
	probe := fake.NewTransaction()
	probe.Add(&knftables.Table{})
	f := strings.Fields(probe.String())
	if len(f) == 4 && f[0] == "add" && f[1] == "table" {
		return knftables.Family(f[2]), f[3]
	}
	return "", ""
}
