package ipvs

import (
	"context"
	"fmt"
	"net/netip"
)

// Interface manages the IPVS virtual and real servers of one network
// namespace. Implementations are safe for concurrent use. Every method
// validates its arguments first and returns an error wrapping [ErrInvalid],
// without touching the kernel, if they are malformed. Virtual servers are
// looked up by address, protocol and port, real servers by address and
// port; the other fields of the values passed are what is written.
type Interface interface {
	// AddVirtualServer creates vs with no real servers. It returns an error
	// wrapping [ErrAlreadyExists] if a virtual server with the same
	// address, protocol and port exists.
	AddVirtualServer(ctx context.Context, vs VirtualServer) error
	// UpdateVirtualServer changes the scheduler, flags and timeout of the
	// existing vs. It returns an error wrapping [ErrNotFound] if there is
	// none.
	UpdateVirtualServer(ctx context.Context, vs VirtualServer) error
	// DeleteVirtualServer deletes vs and its real servers, dropping their
	// connections. It returns an error wrapping [ErrNotFound] if there is
	// none.
	DeleteVirtualServer(ctx context.Context, vs VirtualServer) error
	// GetVirtualServer returns the virtual server with vs's address,
	// protocol and port as the kernel holds it, or an error wrapping
	// [ErrNotFound].
	GetVirtualServer(ctx context.Context, vs VirtualServer) (VirtualServer, error)
	// ListVirtualServers returns every virtual server of the namespace, in
	// no particular order; none gives an empty slice.
	ListVirtualServers(ctx context.Context) ([]VirtualServer, error)
	// Flush deletes every virtual server of the namespace.
	Flush(ctx context.Context) error
	// AddRealServer adds rs to vs. It returns an error wrapping
	// [ErrNotFound] if vs does not exist and one wrapping
	// [ErrAlreadyExists] if vs has a real server with rs's address and
	// port.
	AddRealServer(ctx context.Context, vs VirtualServer, rs RealServer) error
	// UpdateRealServer sets the weight of vs's existing real server rs. It
	// returns an error wrapping [ErrNotFound] if vs or rs does not exist.
	UpdateRealServer(ctx context.Context, vs VirtualServer, rs RealServer) error
	// DeleteRealServer deletes rs from vs, dropping its connections (the
	// kernel expires them on their next packet). It returns an error
	// wrapping [ErrNotFound] if vs or rs does not exist.
	DeleteRealServer(ctx context.Context, vs VirtualServer, rs RealServer) error
	// ListRealServers returns the real servers of vs with their weights
	// and connection counts, in no particular order. A virtual server that
	// does not exist has none: the kernel does not tell the two apart.
	ListRealServers(ctx context.Context, vs VirtualServer) ([]RealServer, error)
	// SetTimeouts sets the namespace's connection timeouts; a zero field
	// leaves that timeout as it is.
	SetTimeouts(ctx context.Context, t Timeouts) error
	// Timeouts returns the namespace's connection timeouts.
	Timeouts(ctx context.Context) (Timeouts, error)
}

// Batcher is implemented by an [Interface] that can apply many writes with
// few system calls, which the [Reconciler] uses when present: faster
// than one call per write (BENCHMARKS.md).
type Batcher interface {
	// ApplyBatch applies ops in order, as if each were the matching
	// Interface call, and carries on after a failed op. It returns nil if
	// every op succeeded and otherwise a *[BatchError] that lists the
	// failed ones. Invalid ops are reported the same way, without being
	// sent.
	ApplyBatch(ctx context.Context, ops []Op) error
}

// OpKind is what an [Op] does.
type OpKind uint8

// The kinds of [Op], each the batched form of the Interface call of the
// same name.
const (
	AddVirtualServer OpKind = iota + 1
	UpdateVirtualServer
	DeleteVirtualServer
	AddRealServer
	UpdateRealServer
	DeleteRealServer
)

var opNames = map[OpKind]string{
	AddVirtualServer: "add virtual server", UpdateVirtualServer: "update virtual server",
	DeleteVirtualServer: "delete virtual server", AddRealServer: "add real server",
	UpdateRealServer: "update real server", DeleteRealServer: "delete real server",
}

// String returns the kind as words: "add real server".
func (k OpKind) String() string {
	if s, ok := opNames[k]; ok {
		return s
	}
	return fmt.Sprintf("OpKind(%d)", uint8(k))
}

// Op is one write of a batch. RealServer is ignored by the virtual server
// kinds.
type Op struct {
	// Kind is what the op does.
	Kind OpKind
	// VirtualServer is the virtual server written, or whose real server
	// is.
	VirtualServer VirtualServer
	// RealServer is the real server written, for the real server kinds.
	RealServer RealServer
}

// String returns the op as words: "add real server 10.0.0.1:8080 to
// 10.96.0.1:80/TCP".
func (op Op) String() string {
	switch op.Kind {
	case AddRealServer:
		return fmt.Sprintf("%s %s to %s", op.Kind, op.RealServer, op.VirtualServer)
	case UpdateRealServer, DeleteRealServer:
		return fmt.Sprintf("%s %s of %s", op.Kind, op.RealServer, op.VirtualServer)
	}
	return fmt.Sprintf("%s %s", op.Kind, op.VirtualServer)
}

// validate checks the op's arguments as the matching Interface call does.
func (op Op) validate() error {
	if _, ok := opNames[op.Kind]; !ok {
		return fmt.Errorf("IPVS op: %w: unknown kind %d", ErrInvalid, op.Kind)
	}
	if err := op.VirtualServer.Validate(); err != nil {
		return err
	}
	if op.Kind >= AddRealServer {
		return op.RealServer.Validate(op.VirtualServer)
	}
	return nil
}

// BatchError lists the ops of a batch that failed.
type BatchError struct {
	// Failed are the failed ops with their errors, in batch order.
	Failed []OpError
}

// OpError is one failed op of a batch.
type OpError struct {
	// Index is the op's position in the batch.
	Index int
	// Op is the op.
	Op Op
	// Err says why it failed; it wraps the package's error kinds like the
	// matching Interface call's error would.
	Err error
}

// Error names the first failed op and how many others failed.
func (e *BatchError) Error() string {
	if len(e.Failed) == 0 {
		return "IPVS batch: no failures"
	}
	msg := e.Failed[0].Err.Error()
	if n := len(e.Failed) - 1; n > 0 {
		msg += fmt.Sprintf(" (and %d more failed ops)", n)
	}
	return msg
}

// Unwrap returns the errors of the failed ops, so that errors.Is finds an
// error kind if any op failed with it.
func (e *BatchError) Unwrap() []error {
	errs := make([]error, len(e.Failed))
	for i, f := range e.Failed {
		errs[i] = f.Err
	}
	return errs
}

// AddressBinder manages the addresses of a dummy interface (kube-proxy's
// kube-ipvs0): the node accepts packets for an address bound there, which
// IPVS then balances, without the address being used as a source or
// answered for on any real link. Implementations are safe for concurrent
// use.
type AddressBinder interface {
	// EnsureDevice creates the dummy interface name if it does not exist
	// and reports whether it did. It returns an error if a link of that
	// name exists but is not a dummy interface.
	EnsureDevice(ctx context.Context, name string) (created bool, err error)
	// DeleteDevice deletes the interface name with its addresses. It
	// returns nil if there is none.
	DeleteDevice(ctx context.Context, name string) error
	// Addresses returns the addresses bound to the interface name, in no
	// particular order, without IPv6 link-local ones. It returns an error
	// wrapping [ErrNotFound] if the interface does not exist.
	Addresses(ctx context.Context, name string) ([]netip.Addr, error)
	// Bind adds addrs to the interface name, each as a host address (/32
	// or /128), in as few system calls as it can. It returns nil if every
	// address was bound. If the interface does not exist it returns an
	// error wrapping [ErrNotFound]. Otherwise failures are per address:
	// the error is an errors.Join of one error per address not bound,
	// each naming it, wrapping [ErrAlreadyExists] for an address bound
	// there already and [ErrInvalid] for a malformed one.
	Bind(ctx context.Context, name string, addrs ...netip.Addr) error
	// Unbind removes addrs from the interface name, with the same errors
	// as Bind, except that an address that is not bound gives an error
	// wrapping [ErrNotFound].
	Unbind(ctx context.Context, name string, addrs ...netip.Addr) error
}
