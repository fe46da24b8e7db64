package ipvs

import "errors"

// Errors that calls wrap, so that callers can tell the common failures
// apart with errors.Is or the Is* helpers. Implementations of [Interface]
// and [AddressBinder], fakes included, wrap these for these conditions.
var (
	// ErrNotFound: the virtual server, real server or address does not
	// exist.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: the virtual server, real server or address exists
	// already.
	ErrAlreadyExists = errors.New("already exists")
	// ErrInvalid: the input is malformed. It is returned before anything
	// is sent to the kernel.
	ErrInvalid = errors.New("invalid")
	// ErrNotSupported: this platform or kernel cannot run IPVS.
	ErrNotSupported = errors.New("IPVS is not supported")
)

// IsNotFound reports whether err means that a virtual server, real server
// or address does not exist.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsAlreadyExists reports whether err means that a virtual server, real
// server or address exists already.
func IsAlreadyExists(err error) bool { return errors.Is(err, ErrAlreadyExists) }
