package ipset

import "context"

// Interface manages the ipsets of one network namespace. Implementations are
// safe for concurrent use. Every method that takes an entry validates it
// first ([Entry.Validate]) and returns an error wrapping [ErrInvalid],
// without touching the kernel, if it is malformed.
type Interface interface {
	// Create creates an empty set as described. It returns an error
	// wrapping [ErrInvalid] if the description is invalid
	// ([Set.Validate]) and one wrapping [ErrAlreadyExists] if a set of that
	// name exists, whatever its type.
	Create(ctx context.Context, set Set) error
	// Destroy destroys the named set and its members. It returns nil if no
	// such set exists, and an error wrapping [ErrInUse] if something in the
	// kernel (an iptables rule) references the set.
	Destroy(ctx context.Context, name string) error
	// Flush removes every member of the named set. It returns an error
	// wrapping [ErrNotFound] if the set does not exist.
	Flush(ctx context.Context, name string) error
	// Swap exchanges the two named sets: afterwards the name a refers to
	// what b held (type, options and members) and the other way round.
	// Kernel references stay with the names, so rules that match on a see
	// b's former contents at once, with no moment in between. It returns an
	// error wrapping [ErrNotFound] if either set does not exist and one
	// wrapping [ErrTypeMismatch] if they are not [Swappable].
	Swap(ctx context.Context, a, b string) error
	// Add adds entry to the named set. It returns an error wrapping
	// [ErrAlreadyExists] if the entry is a member already, [ErrNotFound] if
	// the set does not exist, and [ErrInvalid] if the entry does not fit
	// the set (another type or family, a port outside the range).
	Add(ctx context.Context, name string, entry Entry) error
	// Del removes entry from the named set. It returns an error wrapping
	// [ErrNotFound] if the set does not exist or the entry is not a member.
	Del(ctx context.Context, name string, entry Entry) error
	// Test reports whether entry is a member of the named set. It returns
	// an error wrapping [ErrNotFound] if the set does not exist.
	Test(ctx context.Context, name string, entry Entry) (bool, error)
	// ListEntries returns the members of the named set, in no particular
	// order; an empty set gives an empty slice. It returns an error
	// wrapping [ErrNotFound] if the set does not exist, and one wrapping
	// [ErrInvalid] if the set's type is not one this package supports.
	ListEntries(ctx context.Context, name string) ([]Entry, error)
	// ListSets returns every set of the namespace, sorted by name, with its
	// options as the kernel reports them. Sets of types this package does
	// not support are included with their type name.
	ListSets(ctx context.Context) ([]SetInfo, error)
	// Version returns the ipset netlink protocol versions the kernel
	// speaks.
	Version(ctx context.Context) (Version, error)
}

// SetInfo is a set as the kernel lists it.
type SetInfo struct {
	// Set is the set's description, with every option filled in: the
	// family, the current hash size (which may have grown beyond the one
	// it was created with), the maximum and the port range.
	Set
	// NumEntries is the number of members.
	NumEntries int
	// References is the number of kernel references, such as iptables
	// rules that match on the set. A referenced set cannot be destroyed.
	References int
}

// Version is the ipset netlink protocol version of a kernel.
type Version struct {
	// Protocol is the newest protocol the kernel speaks.
	Protocol uint8
	// MinProtocol is the oldest protocol the kernel still accepts.
	MinProtocol uint8
}
