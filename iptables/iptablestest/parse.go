package iptablestest

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/proxykit/proxykit/iptables"
)

// restoreArgs are the options of one restore, as iptables-restore takes
// them.
type restoreArgs struct {
	// only restores this table alone ("-T table"); "" restores all.
	only iptables.Table
	// noflush is --noflush.
	noflush bool
	// counters is --counters.
	counters bool
}

func (a restoreArgs) list() []string {
	var args []string
	if a.only != "" {
		args = append(args, "-T", string(a.only))
	}
	if a.noflush {
		args = append(args, "--noflush")
	}
	if a.counters {
		args = append(args, "--counters")
	}
	return args
}

// restorer applies iptables-restore input to a set of tables, line by
// line, as iptables-restore does: each table's changes are collected in a
// tx and committed at its COMMIT line.
type restorer struct {
	env     *fakeEnv
	tables  map[iptables.Table]*table
	args    restoreArgs
	command string
	scratch *[]byte
	words   []string
}

// restoreLineBuffer is the size of iptables-restore's line buffer. It
// reads its input with fgets, which stops one byte short of the buffer: a
// longer line is read, and parsed, as several lines.
const restoreLineBuffer = 10240

// maxParam is the size of the buffer a word of a rule is copied into; a
// word that fills it fails with "Parameter too long!".
const maxParam = 1024

// readLine returns the next line of input as iptables-restore 1.8.9 reads
// it (through the newline, or restoreLineBuffer-1 bytes, or the end of the
// input) and the rest of the input. The line is cut at its first NUL byte,
// since iptables-restore handles it as a C string.
func readLine(input string) (line, rest string) {
	n := strings.IndexByte(input, '\n') + 1
	if n == 0 {
		n = len(input)
	}
	n = min(n, restoreLineBuffer-1)
	line, rest = input[:n], input[n:]
	if i := strings.IndexByte(line, 0); i >= 0 {
		line = line[:i]
	}
	return line, rest
}

// isCommit reports whether line ends a table. The legacy binary wants
// exactly "COMMIT\n"; the nft one also takes "COMMIT" at the end of the
// input or before a NUL byte.
func (rs *restorer) isCommit(line string) bool {
	if rs.env.backend == iptables.BackendLegacy {
		return line == "COMMIT\n"
	}
	return line == "COMMIT" || line == "COMMIT\n"
}

// restore applies data to tables. On error, the tables committed before
// the failing one stay applied, and the error is an *iptables.Error that
// names the line.
//
// Lines are told apart by their first byte, as iptables-restore does:
// only "\n" is an empty line, and a line that starts with white space is
// a rule (a command), never a table, a declaration or COMMIT.
func (rs *restorer) restore(data []byte) error {
	input := string(data)
	lineNo := 0
	var x *tx
	skipping := false
	for len(input) > 0 {
		var line string
		line, input = readLine(input)
		lineNo++
		if line == "\n" || (line != "" && line[0] == '#') {
			continue
		}
		fail := func(err error) error { return rs.lineError(lineNo, err) }
		switch {
		case (x != nil || skipping) && rs.isCommit(line):
			if skipping {
				skipping = false
				continue
			}
			if err := x.commit(rs.tables); err != nil {
				return fail(err)
			}
			x = nil
		case line != "" && line[0] == '*' && x == nil && !skipping:
			name, _ := nextToken(line[1:])
			if name == "" {
				return fail(failf("table name invalid"))
			}
			table := iptables.Table(name)
			if rs.args.only != "" && table != rs.args.only {
				skipping = true
				continue
			}
			if !table.Valid() {
				return fail(usagef("unable to initialize table '%s'", name))
			}
			x = begin(rs.env, rs.tables, table, !rs.args.noflush, rs.scratch)
		case skipping:
		case x == nil:
			return fail(failf("no table (\"*table\") before this line"))
		case line != "" && line[0] == ':':
			if err := rs.declaration(x, line); err != nil {
				return fail(err)
			}
		default:
			if err := rs.runLine(x, line); err != nil {
				return fail(err)
			}
		}
	}
	if x != nil {
		return &iptables.Error{
			Command: rs.command, Args: rs.args.list(), ExitStatus: 1, Line: lineNo + 1,
			Stderr: fmt.Sprintf("%s: COMMIT expected at line %d", rs.command, lineNo+1),
		}
	}
	return nil
}

// nextToken returns the first token of s and what follows it, splitting
// on the separators of strtok(s, " \t\n") as iptables-restore does for
// table and chain lines.
func nextToken(s string) (token, rest string) {
	isSep := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' }
	i := 0
	for i < len(s) && isSep(s[i]) {
		i++
	}
	j := i
	for j < len(s) && !isSep(s[j]) {
		j++
	}
	return s[i:j], s[j:]
}

func (rs *restorer) lineError(lineNo int, err error) error {
	status, msg := 1, err.Error()
	var ce *cmdError
	if errors.As(err, &ce) {
		status = ce.status
	}
	return &iptables.Error{
		Command: rs.command, Args: rs.args.list(), ExitStatus: status, Line: lineNo,
		Stderr: fmt.Sprintf("%s: line %d failed: %s", rs.command, lineNo, msg),
	}
}

// declaration handles ":CHAIN POLICY [packets:bytes]".
func (rs *restorer) declaration(x *tx, line string) error {
	var fields []string
	for rest := line[1:]; ; {
		var tok string
		if tok, rest = nextToken(rest); tok == "" {
			break
		}
		fields = append(fields, tok)
	}
	if len(fields) < 2 || len(fields) > 3 {
		return usagef("malformed chain declaration %q", line)
	}
	if len(fields) == 3 {
		if _, _, ok := parseCounters(fields[2]); !ok {
			return usagef("invalid counters %q", fields[2])
		}
	}
	return x.declare(iptables.Chain(fields[0]), fields[1])
}

// parseCounters parses "[packets:bytes]".
func parseCounters(s string) (uint64, uint64, bool) {
	if len(s) < 2 || s[0] != '[' || s[len(s)-1] != ']' {
		return 0, 0, false
	}
	ps, bs, ok := strings.Cut(s[1:len(s)-1], ":")
	if !ok {
		return 0, 0, false
	}
	p, err1 := strconv.ParseUint(ps, 10, 64)
	b, err2 := strconv.ParseUint(bs, 10, 64)
	return p, b, err1 == nil && err2 == nil
}

// runLine handles a command line ("-A CHAIN ..."). A line with no words
// (white space alone) is a command line without a command.
func (rs *restorer) runLine(x *tx, line string) error {
	line = strings.TrimSuffix(line, "\n")
	if line != "" && line[0] == '[' {
		counters, rest, _ := strings.Cut(line, " ")
		if _, _, ok := parseCounters(counters); !ok {
			return usagef("Bad argument `%s'", counters)
		}
		line = rest
	}
	rs.words = splitWords(line, rs.words[:0])
	if len(rs.words) == 0 {
		return usagef("no command specified")
	}
	for _, w := range rs.words {
		if len(w) >= maxParam {
			return usagef("Parameter too long!")
		}
	}
	return runCommand(x, rs.words)
}

// runCommand applies one iptables command, given as words, to x.
func runCommand(x *tx, words []string) error {
	if len(words) == 0 {
		return nil
	}
	cmd, args := words[0], words[1:]
	chainArg := func() (iptables.Chain, error) {
		if len(args) == 0 || args[0] == "" {
			return "", usagef("option %q requires an argument", cmd)
		}
		c := iptables.Chain(args[0])
		args = args[1:]
		return c, nil
	}
	optionalChain := func() (iptables.Chain, error) {
		if len(args) == 0 {
			return "", nil
		}
		if len(args) > 1 {
			return "", usagef("Bad argument `%s'", args[1])
		}
		return iptables.Chain(args[0]), nil
	}
	number := func() (int, bool) {
		if len(args) == 0 {
			return 0, false
		}
		n, err := strconv.Atoi(args[0])
		if err != nil {
			return 0, false
		}
		args = args[1:]
		return n, true
	}
	switch cmd {
	case "-A", "--append", "-I", "--insert":
		c, err := chainArg()
		if err != nil {
			return err
		}
		pos := 0
		if cmd == "-I" || cmd == "--insert" {
			pos = 1
			if n, ok := number(); ok {
				if n < 1 {
					return usagef("Invalid rule number `%d'", n)
				}
				pos = n
			}
		}
		r, err := x.parse(c, args)
		if err != nil {
			return err
		}
		return x.insert(c, pos, r)
	case "-D", "--delete":
		c, err := chainArg()
		if err != nil {
			return err
		}
		if len(args) == 1 {
			if n, ok := number(); ok {
				if n < 1 {
					return usagef("Invalid rule number `%d'", n)
				}
				return x.deleteNum(c, n)
			}
		}
		r, err := x.parse(c, args)
		if err != nil {
			return err
		}
		found, err := x.deleteRule(c, r)
		if err == nil && !found {
			err = failf("Bad rule (does a matching rule exist in that chain?).")
		}
		return err
	case "-R", "--replace":
		c, err := chainArg()
		if err != nil {
			return err
		}
		n, ok := number()
		if !ok || n < 1 {
			return usagef("-R requires a rule number")
		}
		r, err := x.parse(c, args)
		if err != nil {
			return err
		}
		return x.replace(c, n, r)
	case "-N", "--new-chain":
		c, err := chainArg()
		if err != nil {
			return err
		}
		if len(args) > 0 {
			return usagef("Bad argument `%s'", args[0])
		}
		return x.newChain(c)
	case "-X", "--delete-chain":
		c, err := optionalChain()
		if err != nil {
			return err
		}
		if c == "" {
			return x.deleteUserChains()
		}
		return x.deleteChain(c)
	case "-F", "--flush":
		c, err := optionalChain()
		if err != nil {
			return err
		}
		if c == "" {
			x.flushAll()
			return nil
		}
		return x.flushChain(c)
	case "-Z", "--zero":
		c, err := optionalChain()
		if err != nil || c == "" {
			return err
		}
		if x.get(c) == nil {
			return failf("No chain/target/match by that name.")
		}
		return nil
	case "-P", "--policy":
		c, err := chainArg()
		if err != nil {
			return err
		}
		if len(args) != 1 {
			return usagef("-P requires a chain and a policy")
		}
		return x.setPolicy(c, args[0])
	case "-t", "--table":
		return usagef("The -t option cannot be used in iptables-restore.")
	case "-E", "--rename-chain", "-C", "--check", "-L", "--list", "-S", "--list-rules":
		return unsupportedf("command %s in restore input", cmd)
	}
	if strings.HasPrefix(cmd, "-") {
		return unsupportedf("%q before the command (write the command, such as -A, first)", cmd)
	}
	return usagef("Bad argument `%s'", cmd)
}

// splitWords splits a line into words as iptables-restore does: words are
// separated by white space; double quotes make one word of what they
// enclose (the quotes are dropped, a closing quote ends the word, and a
// quote left open runs to the end of the line); inside quotes a backslash
// makes the next character literal. Single quotes and backslashes outside
// quotes are ordinary characters. words is reused.
func splitWords(line string, words []string) []string {
	if strings.IndexByte(line, '"') < 0 {
		start := -1
		for i := 0; i < len(line); i++ {
			if c := line[i]; c == ' ' || c == '\t' {
				if start >= 0 {
					words = append(words, line[start:i])
					start = -1
				}
			} else if start < 0 {
				start = i
			}
		}
		if start >= 0 {
			words = append(words, line[start:])
		}
		return words
	}
	var b strings.Builder
	inWord, quoted, escaped := false, false, false
	emit := func() {
		words = append(words, b.String())
		b.Reset()
		inWord = false
	}
	for i := 0; i < len(line); i++ {
		c := line[i]
		if quoted {
			switch {
			case escaped:
				b.WriteByte(c)
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				quoted = false
				emit()
			default:
				b.WriteByte(c)
			}
			continue
		}
		switch c {
		case '"':
			quoted, inWord = true, true
		case ' ', '\t':
			if inWord {
				emit()
			}
		default:
			b.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		emit()
	}
	return words
}
