package nftables

import (
	"errors"
	"time"
)

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
