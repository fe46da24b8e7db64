package ipset

import "errors"

// Errors that calls wrap, so that callers can tell the common failures
// apart with errors.Is or the Is* helpers. Implementations of [Interface],
// fakes included, wrap these and nothing else for these conditions.
var (
	// ErrNotFound: the set does not exist, or (for Del) the entry is not a
	// member. Test for it with [IsNotFound].
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: a set of that name exists (Create), or the entry is
	// already a member (Add). Test for it with [IsAlreadyExists].
	ErrAlreadyExists = errors.New("already exists")
	// ErrInUse: the set is referenced by a kernel component, such as an
	// iptables rule with "-m set --match-set", and cannot be destroyed.
	// Test for it with [IsInUse].
	ErrInUse = errors.New("in use")
	// ErrTypeMismatch: the sets of a swap store different element kinds or
	// families. Test for it with [IsTypeMismatch].
	ErrTypeMismatch = errors.New("type mismatch")
	// ErrInvalid: a set or entry is malformed or does not fit its set. It
	// is returned before anything is sent to the kernel. Test for it with
	// errors.Is.
	ErrInvalid = errors.New("invalid")
	// ErrNotSupported: ipsets are not available on this platform; the
	// error that wraps it names the operating system. Test for it with
	// [IsNotSupported].
	ErrNotSupported = errors.New("ipset: not supported")
)

// IsNotFound reports whether err means that a set, or an entry being
// deleted, does not exist.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsAlreadyExists reports whether err means that a set being created, or an
// entry being added, exists already.
func IsAlreadyExists(err error) bool { return errors.Is(err, ErrAlreadyExists) }

// IsInUse reports whether err means that a set could not be destroyed
// because something in the kernel references it.
func IsInUse(err error) bool { return errors.Is(err, ErrInUse) }

// IsTypeMismatch reports whether err means that two sets could not be
// swapped because they store different kinds of elements.
func IsTypeMismatch(err error) bool { return errors.Is(err, ErrTypeMismatch) }

// IsNotSupported reports whether err means that ipsets are not available
// on this platform.
func IsNotSupported(err error) bool { return errors.Is(err, ErrNotSupported) }
