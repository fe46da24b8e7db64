package iptables

import (
	"errors"
	"strconv"
	"strings"
	"time"
)

// ErrNotSupported is wrapped by the error [New] returns on platforms other
// than Linux; the error names the operating system. Test for it with
// [IsNotSupported].
var ErrNotSupported = errors.New("iptables: not supported")

// IsNotSupported reports whether err, or an error it wraps, is
// [ErrNotSupported].
func IsNotSupported(err error) bool { return errors.Is(err, ErrNotSupported) }

// ErrNotFound is matched by errors.Is in an [*Error] whose command said
// that a chain, a rule or a table does not exist; the command's error is
// an *Error, not a wrapper of ErrNotFound, since the binaries say so only
// in their standard error. Test for it with [IsNotFound].
var ErrNotFound = errors.New("iptables: not found")

// errLockTimeout is wrapped by the error of a restore that gave up waiting
// for the xtables lock that proxykit takes itself for old iptables-restore
// binaries that cannot wait for it.
var errLockTimeout = errors.New("timed out waiting for the xtables lock")

// commandTimeout is wrapped by the error of a command that the Interface
// killed because it ran longer than [WithCommandTimeout] allows.
type commandTimeout struct{ after time.Duration }

func (e *commandTimeout) Error() string {
	return "killed: timed out after " + e.after.String()
}

// IsCommandTimeout reports whether err says that a command ran longer than
// [WithCommandTimeout] allows and was killed. Such a command may have done
// part of its work (a restore's earlier commits, say), so treat it as any
// failed restore: sync everything again.
func IsCommandTimeout(err error) bool {
	var t *commandTimeout
	return errors.As(err, &t)
}

// Error is a failed iptables, iptables-save or iptables-restore command. All
// errors from [Interface] methods that ran a command are an *Error or wrap
// one; the Fake in iptables/iptablestest returns the same type with the
// messages the real binaries print, so [IsNotFound] and
// [IsLockTimeout] work the same against both.
type Error struct {
	// Command is the binary that ran, such as "iptables-nft-restore".
	Command string
	// Args are its arguments.
	Args []string
	// ExitStatus is the command's exit status, or -1 if it did not exit
	// normally (it could not be started, or was killed when its context
	// ended).
	ExitStatus int
	// Stderr is the command's standard error, with surrounding white space
	// removed.
	Stderr string
	// Line is the line of restore input that iptables-restore blamed
	// ("line 3 failed", "Error occurred at line: 3"), or 0 if it named
	// none.
	Line int
	// Err is the underlying error: the exec error, a lock timeout, or a
	// command timeout ([IsCommandTimeout]).
	Err error
}

// Error returns the command line, the exit status and the interesting part
// of standard error on one line.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Command)
	for _, a := range e.Args {
		b.WriteByte(' ')
		b.WriteString(a)
	}
	b.WriteString(": ")
	if e.ExitStatus >= 0 {
		b.WriteString("exit status ")
		b.WriteString(strconv.Itoa(e.ExitStatus))
	} else if e.Err != nil {
		b.WriteString(e.Err.Error())
	} else {
		b.WriteString("failed")
	}
	if msg := stderrSummary(e.Stderr); msg != "" {
		b.WriteString(": ")
		b.WriteString(msg)
	}
	return b.String()
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is [ErrNotFound] and the command said that
// something does not exist, so that errors.Is(err, ErrNotFound) agrees
// with [IsNotFound].
func (e *Error) Is(target error) bool { return target == ErrNotFound && e.notFound() }

// missingJumpTarget reports whether err is iptables refusing rule args
// because the chain it jumps to (-j or -g) does not exist. Legacy prints
// "Couldn't load target `NAME':No such file or directory", nft "Chain 'NAME'
// does not exist"; both exit with status 2.
func missingJumpTarget(err error, args []string) bool {
	var e *Error
	if !errors.As(err, &e) || e.ExitStatus != 2 {
		return false
	}
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "-j", "--jump", "-g", "--goto":
			target := args[i+1]
			return strings.Contains(e.Stderr, "Couldn't load target `"+target+"':No such file") ||
				strings.Contains(e.Stderr, "Chain '"+target+"' does not exist")
		}
	}
	return false
}

// stderrSummary joins the lines of stderr with "; ", leaving out blank
// lines and iptables' "Try `iptables -h'" hint.
func stderrSummary(stderr string) string {
	var parts []string
	for _, line := range strings.Split(stderr, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "Try `") {
			continue
		}
		parts = append(parts, line)
	}
	return strings.Join(parts, "; ")
}

// IsNotFound reports whether err says that a chain, a rule or a table
// does not exist (for example FlushChain of a missing chain, or a restore
// that appends to an undeclared chain): the first [*Error] in err's chain
// exited with a status and printed one of the binaries' "missing" phrases;
// or that NFAcct.Get found no counter of that name.
func IsNotFound(err error) bool {
	if errors.Is(err, ErrNFAcctNotFound) {
		return true
	}
	var e *Error
	return errors.As(err, &e) && e.notFound()
}

// notFound reports whether the command exited saying that something is
// missing.
func (e *Error) notFound() bool {
	if e.ExitStatus < 0 {
		return false
	}
	for _, s := range notFoundMessages {
		if strings.Contains(e.Stderr, s) {
			return true
		}
	}
	return false
}

// notFoundMessages are the phrases iptables (legacy and nft) prints when an
// object is missing.
var notFoundMessages = []string{
	"No chain/target/match by that name",
	"does a matching rule exist in that chain",
	"does not exist",
}

// IsLockTimeout reports whether err says that the command gave up waiting
// for the xtables lock held by another program: exit status 4 and
// "Another app is currently holding the xtables lock", or proxykit's own
// wait for the lock (for iptables-restore older than 1.6.2) timing out.
func IsLockTimeout(err error) bool {
	if errors.Is(err, errLockTimeout) {
		return true
	}
	var e *Error
	return errors.As(err, &e) && e.ExitStatus == 4 &&
		strings.Contains(e.Stderr, "Another app is currently holding the xtables lock")
}

// restoreLine returns the input line that iptables-restore's standard
// error blames, or 0. It knows the forms "line 3 failed", "Error occurred
// at line: 3", "COMMIT expected at line 3" and nft's "line 3: RULE_APPEND
// failed".
func restoreLine(stderr string) int {
	rest := stderr
	for {
		i := strings.Index(rest, "line")
		if i < 0 {
			return 0
		}
		rest = rest[i+len("line"):]
		s := strings.TrimPrefix(rest, ":")
		if !strings.HasPrefix(s, " ") {
			continue
		}
		s = s[1:]
		n := 0
		for n < len(s) && s[n] >= '0' && s[n] <= '9' {
			n++
		}
		if n == 0 {
			continue
		}
		if v, err := strconv.Atoi(s[:n]); err == nil {
			return v
		}
	}
}
