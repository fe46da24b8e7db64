package nftables

import (
	"errors"
	"time"

	"sigs.k8s.io/knftables"
)

// ErrNotSupported is wrapped by the errors of what needs nf_tables on a
// platform without it (every platform but Linux); the error names the
// operating system. Test for it with [IsNotSupported].
var ErrNotSupported = errors.New("nftables: not supported")

// IsNotSupported reports whether err, or an error it wraps, is
// [ErrNotSupported].
func IsNotSupported(err error) bool { return errors.Is(err, ErrNotSupported) }

// IsNotFound reports whether err says that something is missing: a table
// that KernelState was asked to read (an error wrapping [ErrTableNotFound]),
// or a table, chain, set, map, rule or element that an nft command or
// knftables.Fake named (knftables.IsNotFound). It is false for nil and for
// every other error, including a table that exists but is empty.
func IsNotFound(err error) bool {
	return errors.Is(err, ErrTableNotFound) || knftables.IsNotFound(err)
}

// commandTimeout is wrapped by the error of an nft command that
// BoundedInterface stopped, or of an nf_tables netlink request that got
// no answer, because it ran longer than its bound.
type commandTimeout struct {
	after time.Duration
	// what says what was stopped: "killed" for an nft command, or the
	// netlink request that got no answer.
	what string
}

func (e *commandTimeout) Error() string {
	return e.what + ": timed out after " + e.after.String()
}

// IsCommandTimeout reports whether err says that an nft command ran longer
// than its bound (BoundedInterface) and was killed, or that an nf_tables
// netlink request (Netlink) got no answer within its bound. A transaction
// or batch that timed out may have been committed or not: treat it as any
// failed one, whose outcome is unknown, and sync everything again
// (Writer.Applied does). It is the twin of iptables.IsCommandTimeout.
func IsCommandTimeout(err error) bool {
	var t *commandTimeout
	return errors.As(err, &t)
}
