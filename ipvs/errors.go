package ipvs

import "errors"

// Errors that calls wrap, so that callers can tell the common failures
// apart with errors.Is or the Is* helpers. Implementations of [Interface]
// and [AddressBinder], fakes included, wrap these for these conditions.
var (
	// ErrNotFound: the virtual server, real server or address does not
	// exist. Test for it with [IsNotFound].
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: the virtual server, real server or address exists
	// already. Test for it with [IsAlreadyExists].
	ErrAlreadyExists = errors.New("already exists")
	// ErrInvalid: the input is malformed. It is returned before anything
	// is sent to the kernel. Test for it with errors.Is.
	ErrInvalid = errors.New("invalid")
	// ErrNotSupported: this platform or kernel cannot run IPVS, or lacks
	// a scheduler; the error that wraps it says why (the operating system,
	// the missing modules). Test for it with [IsNotSupported].
	ErrNotSupported = errors.New("ipvs: not supported")
)

// IsNotFound reports whether err means that a virtual server, real server
// or address does not exist.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsAlreadyExists reports whether err means that a virtual server, real
// server or address exists already.
func IsAlreadyExists(err error) bool { return errors.Is(err, ErrAlreadyExists) }

// IsNotSupported reports whether err means that this platform or kernel
// cannot run IPVS, or lacks the scheduler asked for.
func IsNotSupported(err error) bool { return errors.Is(err, ErrNotSupported) }
