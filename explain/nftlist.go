package explain

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"
)

// loadListing reads the output of `nft list table` into fake: the table,
// its sets and maps with their elements, its chains and their rules, the
// rules rewritten where nft prints them otherwise than the nftables
// writers (and kube-proxy) write them, so that the tracer reads them as it
// reads the writers' (see normalizeRule).
func loadListing(fake *knftables.Fake, family knftables.Family, table, listing string) error {
	tx := fake.NewTransaction()
	lines := strings.Split(listing, "\n")
	i := 0
	next := func() (string, bool) {
		for i < len(lines) {
			l := strings.TrimSpace(lines[i])
			i++
			if l != "" && !strings.HasPrefix(l, "#") {
				return l, true
			}
		}
		return "", false
	}
	lineErr := func(format string, args ...any) error {
		return fmt.Errorf("line %d: %s", i, fmt.Sprintf(format, args...))
	}
	head, ok := next()
	if !ok {
		return fmt.Errorf("empty listing: no table %s %s", family, table)
	}
	if want := fmt.Sprintf("table %s %s {", family, table); head != want {
		return lineErr("%q is not %q", head, want)
	}
	tbl := &knftables.Table{}
	tx.Add(tbl)
	var rules []*knftables.Rule
	// pending are the elements, added after the chains their verdicts
	// name.
	var pending []*knftables.Element
	for {
		l, ok := next()
		if !ok {
			return fmt.Errorf("the listing ends inside table %s %s", family, table)
		}
		if l == "}" {
			break
		}
		if c, ok := parseComment(l); ok {
			tbl.Comment = &c
			continue
		}
		if strings.HasPrefix(l, "flags ") {
			continue
		}
		kind, rest, _ := strings.Cut(l, " ")
		name, ok := strings.CutSuffix(rest, " {")
		if !ok {
			return lineErr("cannot read %q", l)
		}
		name = unquote(name)
		switch kind {
		case "chain":
			c := &knftables.Chain{Name: name}
			tx.Add(c)
			for {
				l, ok := next()
				if !ok {
					return fmt.Errorf("the listing ends inside chain %s", name)
				}
				if l == "}" {
					break
				}
				if strings.HasPrefix(l, "type ") {
					if err := parseBaseChain(c, l); err != nil {
						return lineErr("chain %s: %v", name, err)
					}
					continue
				}
				if cm, ok := parseComment(l); ok {
					c.Comment = &cm
					continue
				}
				text, comment := splitRuleComment(l)
				r := &knftables.Rule{Chain: name, Rule: normalizeRule(text)}
				if comment != "" {
					r.Comment = &comment
				}
				rules = append(rules, r)
			}
		case "set", "map":
			props := map[string]string{}
			var elements string
			dynamic := false
			for {
				l, ok := next()
				if !ok {
					return fmt.Errorf("the listing ends inside %s %s", kind, name)
				}
				if l == "}" {
					break
				}
				if rest, ok := strings.CutPrefix(l, "elements = "); ok {
					// The list may go on over several lines, to its
					// closing brace.
					for strings.Count(rest, "{") > strings.Count(rest, "}") {
						more, ok := next()
						if !ok {
							return fmt.Errorf("the listing ends inside the elements of %s %s", kind, name)
						}
						rest += " " + more
					}
					elements = rest
					continue
				}
				if cm, ok := parseComment(l); ok {
					props["comment"] = cm
					continue
				}
				k, v, _ := strings.Cut(l, " ")
				props[k] = v
				if k == "flags" && strings.Contains(v, "dynamic") {
					dynamic = true
				}
			}
			if err := addSetOrMap(tx, kind, name, props); err != nil {
				return lineErr("%s %s: %v", kind, name, err)
			}
			// Affinity sets fill as clients connect; a traced packet is
			// a client's first, so they are read as empty.
			if elements != "" && !dynamic {
				els, err := parseElements(kind, name, elements)
				if err != nil {
					return lineErr("%v", err)
				}
				pending = append(pending, els...)
			}
		default:
			return lineErr("cannot read %s %s: only chains, sets and maps are read", kind, name)
		}
	}
	// Elements and rules last: they may name any set, map or chain of the
	// table.
	for _, e := range pending {
		tx.Add(e)
	}
	for _, r := range rules {
		tx.Add(r)
	}
	return fake.Run(context.Background(), tx)
}

// parseComment reads a `comment "TEXT"` line.
func parseComment(l string) (string, bool) {
	rest, ok := strings.CutPrefix(l, "comment ")
	if !ok || !strings.HasPrefix(rest, `"`) || !strings.HasSuffix(rest, `"`) || len(rest) < 2 {
		return "", false
	}
	return rest[1 : len(rest)-1], true
}

func unquote(s string) string {
	if len(s) >= 2 && s[0] == '"' && s[len(s)-1] == '"' {
		return s[1 : len(s)-1]
	}
	return s
}

// baseChainLine is nft's first line of a base chain.
var baseChainLine = regexp.MustCompile(`^type (\S+) hook (\S+)(?: device \S+)? priority ([^;]+);(?: policy (\S+);)?$`)

func parseBaseChain(c *knftables.Chain, l string) error {
	m := baseChainLine.FindStringSubmatch(l)
	if m == nil {
		return fmt.Errorf("cannot read %q", l)
	}
	typ, hook := knftables.BaseChainType(m[1]), knftables.BaseChainHook(m[2])
	prio, err := priorityNumber(strings.TrimSpace(m[3]))
	if err != nil {
		return err
	}
	p := knftables.BaseChainPriority(strconv.Itoa(prio))
	c.Type, c.Hook, c.Priority = &typ, &hook, &p
	if m[4] != "" && m[4] != "accept" {
		policy := knftables.BaseChainPolicy(m[4])
		c.Policy = &policy
	}
	return nil
}

// standardPriorities are the names nft prints for the standard priorities
// of the ip and ip6 families.
var standardPriorities = map[string]int{"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0, "security": 50, "srcnat": 100}

// priorityNumber evaluates a priority as nft prints it: a number, or a
// standard name, alone or followed by "+ N" or "- N".
func priorityNumber(s string) (int, error) {
	if n, err := strconv.Atoi(s); err == nil {
		return n, nil
	}
	words := strings.Fields(s)
	base, ok := standardPriorities[words[0]]
	switch {
	case !ok:
	case len(words) == 1:
		return base, nil
	case len(words) == 3 && (words[1] == "+" || words[1] == "-"):
		n, err := strconv.Atoi(words[2])
		if err != nil {
			break
		}
		if words[1] == "-" {
			n = -n
		}
		return base + n, nil
	}
	return 0, fmt.Errorf("cannot evaluate priority %q", s)
}

func addSetOrMap(tx *knftables.Transaction, kind, name string, props map[string]string) error {
	var comment *string
	if c, ok := props["comment"]; ok {
		comment = &c
	}
	var flags []knftables.SetFlag
	if f := props["flags"]; f != "" {
		for _, x := range strings.Split(f, ",") {
			flags = append(flags, knftables.SetFlag(strings.TrimSpace(x)))
		}
	}
	typ, typeOf := props["type"], props["typeof"]
	if typ == "" && typeOf == "" {
		return fmt.Errorf("no type")
	}
	if kind == "set" {
		tx.Add(&knftables.Set{Name: name, Type: typ, TypeOf: typeOf, Flags: flags, Comment: comment})
	} else {
		tx.Add(&knftables.Map{Name: name, Type: typ, TypeOf: typeOf, Flags: flags, Comment: comment})
	}
	return nil
}

// parseElements reads the "{ a . b : v, ... }" list of a set or map.
func parseElements(kind, name, list string) ([]*knftables.Element, error) {
	list = strings.TrimSpace(list)
	if !strings.HasPrefix(list, "{") || !strings.HasSuffix(list, "}") {
		return nil, fmt.Errorf("elements of %s %s: cannot read %q", kind, name, list)
	}
	var out []*knftables.Element
	for _, item := range splitTopLevel(list[1:len(list)-1], ',') {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		keyText, value, hasValue := cutOutsideQuotes(item, " : ")
		if (kind == "map") != hasValue {
			return nil, fmt.Errorf("element %q of %s %s", item, kind, name)
		}
		// A comment or timeout follows the key.
		var comment *string
		if k, c, ok := cutOutsideQuotes(keyText, " comment "); ok {
			keyText = k
			c = unquote(strings.TrimSpace(c))
			comment = &c
		}
		if k, _, ok := strings.Cut(keyText, " timeout "); ok {
			keyText = k
		}
		if k, _, ok := strings.Cut(keyText, " expires "); ok {
			keyText = k
		}
		e := &knftables.Element{Key: splitConcat(keyText), Comment: comment}
		if kind == "map" {
			e.Map = name
			e.Value = splitConcat(value)
			if len(e.Value) == 1 {
				e.Value = []string{strings.Join(strings.Fields(e.Value[0]), " ")}
			}
		} else {
			e.Set = name
		}
		out = append(out, e)
	}
	return out, nil
}

func splitConcat(s string) []string {
	parts := strings.Split(strings.TrimSpace(s), " . ")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

// splitTopLevel splits s at sep outside quotes and braces.
func splitTopLevel(s string, sep byte) []string {
	var out []string
	depth, quoted, start := 0, false, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"':
			quoted = !quoted
		case quoted:
		case c == '{':
			depth++
		case c == '}':
			depth--
		case c == sep && depth == 0:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// cutOutsideQuotes is strings.Cut at the first sep outside quotes.
func cutOutsideQuotes(s, sep string) (before, after string, found bool) {
	quoted := false
	for i := 0; i < len(s); i++ {
		if s[i] == '"' {
			quoted = !quoted
			continue
		}
		if !quoted && strings.HasPrefix(s[i:], sep) {
			return s[:i], s[i+len(sep):], true
		}
	}
	return s, "", false
}

// splitRuleComment takes a rule's trailing `comment "..."` off.
func splitRuleComment(l string) (rule, comment string) {
	if !strings.HasSuffix(l, `"`) {
		return l, ""
	}
	i := strings.LastIndex(l, ` comment "`)
	if i < 0 {
		return l, ""
	}
	return l[:i], l[i+len(` comment "`) : len(l)-1]
}

var (
	// counterStmt is a counter, with the values nft prints unless -s.
	counterStmt = regexp.MustCompile(`(^| )counter( name "[^"]*"| name \S+)?( packets \d+ bytes \d+)?( |$)`)
	// markOp is nft's spelling of a mark operation.
	markSet   = regexp.MustCompile(`\bmeta mark set meta mark ([|^]) (\S+)`)
	markMatch = regexp.MustCompile(`\bmeta mark & (\S+) (==|!=) (\S+)`)
	// braceComma is a comma that nft prints against the word before it,
	// inside an anonymous set or map.
	braceComma = regexp.MustCompile(`(\S),( |$)`)
)

// normalizeRule rewrites a rule as nft prints it into the form the
// writers write it in, which the tracer reads and Compare compares: no
// counter (anonymous or named: it changes no packet's way), marks as "mark set mark or|xor V" and "mark and M == V", and
// list commas apart from the words around them.
func normalizeRule(rule string) string {
	rule = counterStmt.ReplaceAllString(rule, "$1")
	rule = markSet.ReplaceAllStringFunc(rule, func(s string) string {
		m := markSet.FindStringSubmatch(s)
		op := "or"
		if m[1] == "^" {
			op = "xor"
		}
		return "mark set mark " + op + " " + m[2]
	})
	rule = markMatch.ReplaceAllString(rule, "mark and $1 $2 $3")
	if strings.Contains(rule, "{") {
		rule = braceComma.ReplaceAllString(rule, "$1 ,$2")
	}
	return strings.Join(strings.Fields(rule), " ")
}
