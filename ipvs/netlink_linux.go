package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"

	mobyipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/kernel"
)

// Netlink is the kernel implementation of [Interface] and [Batcher]. Single
// calls go through github.com/moby/ipvs; batches are encoded here in the
// same generic netlink format and sent many to a system call, because a
// round trip per write is what dominates the cost of a large sync. It needs
// no ipvsadm binary. Make one with [New] and Close it when done.
type Netlink struct {
	mu sync.Mutex // serialises the moby handle, whose socket is not safe for concurrent use
	h  *mobyipvs.Handle

	batch  *batchSocket
	family uint16
}

var (
	_ Interface = (*Netlink)(nil)
	_ Batcher   = (*Netlink)(nil)
)

// New checks that the kernel can run IPVS and opens netlink sockets in the
// caller's network namespace, or in the one given by [WithNetNSPath].
//
// The check is kernel.New().CanUseIPVS (or the checker given with
// [WithPrerequisites]) for the schedulers of [WithSchedulers], then the
// presence of the IPVS generic netlink family. If either fails, New returns
// an error wrapping [ErrNotSupported] and the checker's error (such as a
// *kernel.IPVSUnavailableError naming the missing modules), and opens
// nothing. IPVS must be loaded before the first New of a process:
// github.com/moby/ipvs resolves the family once per process.
func New(ctx context.Context, opts ...Option) (*Netlink, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	checker := o.checker
	if checker == nil && !o.noChecker {
		checker = kernel.New()
	}
	if checker != nil {
		if err := checker.CanUseIPVS(ctx, o.schedulers...); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNotSupported, err)
		}
	}
	fam, err := netlink.GenlFamilyGet("IPVS")
	if err != nil {
		return nil, fmt.Errorf("%w: the kernel has no IPVS generic netlink family (is ip_vs loaded?): %w", ErrNotSupported, err)
	}
	h, err := mobyipvs.New(o.netnsPath)
	if err != nil {
		return nil, fmt.Errorf("ipvs: netlink socket in %q: %w", o.netnsPath, err)
	}
	ns := netns.None()
	if o.netnsPath != "" {
		if ns, err = netns.GetFromPath(o.netnsPath); err != nil {
			h.Close()
			return nil, fmt.Errorf("ipvs: opening network namespace %s: %w", o.netnsPath, err)
		}
		defer ns.Close()
	}
	batch, err := newBatchSocket(ns, unix.NETLINK_GENERIC)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("ipvs: netlink socket in %q: %w", o.netnsPath, err)
	}
	return &Netlink{h: h, batch: batch, family: fam.ID}, nil
}

// Close closes the netlink sockets. The Netlink must not be used after.
func (n *Netlink) Close() {
	n.h.Close()
	n.batch.close()
}

// do runs fn on the moby handle, after ctx is checked.
func (n *Netlink) do(ctx context.Context, fn func(h *mobyipvs.Handle) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return fn(n.h)
}

// AddVirtualServer is part of [Interface].
func (n *Netlink) AddVirtualServer(ctx context.Context, vs VirtualServer) error {
	return n.writeVS(ctx, AddVirtualServer, vs, (*mobyipvs.Handle).NewService)
}

// UpdateVirtualServer is part of [Interface].
func (n *Netlink) UpdateVirtualServer(ctx context.Context, vs VirtualServer) error {
	return n.writeVS(ctx, UpdateVirtualServer, vs, (*mobyipvs.Handle).UpdateService)
}

// DeleteVirtualServer is part of [Interface].
func (n *Netlink) DeleteVirtualServer(ctx context.Context, vs VirtualServer) error {
	return n.writeVS(ctx, DeleteVirtualServer, vs, (*mobyipvs.Handle).DelService)
}

func (n *Netlink) writeVS(ctx context.Context, k OpKind, vs VirtualServer, fn func(*mobyipvs.Handle, *mobyipvs.Service) error) error {
	op := Op{Kind: k, VirtualServer: vs}
	if err := op.validate(); err != nil {
		return err
	}
	err := n.do(ctx, func(h *mobyipvs.Handle) error { return fn(h, toMobyService(vs)) })
	return opError(op, err)
}

// AddRealServer is part of [Interface].
func (n *Netlink) AddRealServer(ctx context.Context, vs VirtualServer, rs RealServer) error {
	return n.writeRS(ctx, AddRealServer, vs, rs, (*mobyipvs.Handle).NewDestination)
}

// UpdateRealServer is part of [Interface].
func (n *Netlink) UpdateRealServer(ctx context.Context, vs VirtualServer, rs RealServer) error {
	return n.writeRS(ctx, UpdateRealServer, vs, rs, (*mobyipvs.Handle).UpdateDestination)
}

// DeleteRealServer is part of [Interface].
func (n *Netlink) DeleteRealServer(ctx context.Context, vs VirtualServer, rs RealServer) error {
	return n.writeRS(ctx, DeleteRealServer, vs, rs, (*mobyipvs.Handle).DelDestination)
}

func (n *Netlink) writeRS(ctx context.Context, k OpKind, vs VirtualServer, rs RealServer, fn func(*mobyipvs.Handle, *mobyipvs.Service, *mobyipvs.Destination) error) error {
	op := Op{Kind: k, VirtualServer: vs, RealServer: rs}
	if err := op.validate(); err != nil {
		return err
	}
	err := n.do(ctx, func(h *mobyipvs.Handle) error { return fn(h, toMobyService(vs), toMobyDest(rs)) })
	return opError(op, err)
}

// GetVirtualServer is part of [Interface].
func (n *Netlink) GetVirtualServer(ctx context.Context, vs VirtualServer) (VirtualServer, error) {
	if err := checkIdentity(vs); err != nil {
		return VirtualServer{}, err
	}
	var got *mobyipvs.Service
	err := n.do(ctx, func(h *mobyipvs.Handle) (err error) {
		got, err = h.GetService(toMobyService(vs))
		return err
	})
	if err != nil {
		return VirtualServer{}, fmt.Errorf("getting virtual server %s: %w", vs, classify(err, 0))
	}
	res, ok := fromMobyService(got)
	if !ok {
		return VirtualServer{}, fmt.Errorf("getting virtual server %s: the kernel returned %+v", vs, got)
	}
	return res, nil
}

// ListVirtualServers is part of [Interface]. Firewall-mark virtual servers
// are left out.
func (n *Netlink) ListVirtualServers(ctx context.Context) ([]VirtualServer, error) {
	var svcs []*mobyipvs.Service
	err := n.do(ctx, func(h *mobyipvs.Handle) (err error) {
		svcs, err = h.GetServices()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listing virtual servers: %w", classify(err, 0))
	}
	list := make([]VirtualServer, 0, len(svcs))
	for _, s := range svcs {
		if vs, ok := fromMobyService(s); ok {
			list = append(list, vs)
		}
	}
	return list, nil
}

// Flush is part of [Interface].
func (n *Netlink) Flush(ctx context.Context) error {
	if err := n.do(ctx, (*mobyipvs.Handle).Flush); err != nil {
		return fmt.Errorf("flushing IPVS: %w", classify(err, 0))
	}
	return nil
}

// ListRealServers is part of [Interface].
func (n *Netlink) ListRealServers(ctx context.Context, vs VirtualServer) ([]RealServer, error) {
	if err := checkIdentity(vs); err != nil {
		return nil, err
	}
	var dests []*mobyipvs.Destination
	err := n.do(ctx, func(h *mobyipvs.Handle) (err error) {
		dests, err = h.GetDestinations(toMobyService(vs))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listing real servers of %s: %w", vs, classify(err, 0))
	}
	list := make([]RealServer, 0, len(dests))
	for _, d := range dests {
		a, _ := netip.AddrFromSlice(d.Address)
		list = append(list, RealServer{
			Address: a.Unmap(), Port: d.Port, Weight: d.Weight,
			ActiveConn: d.ActiveConnections, InactiveConn: d.InactiveConnections,
		})
	}
	return list, nil
}

// SetTimeouts is part of [Interface].
func (n *Netlink) SetTimeouts(ctx context.Context, t Timeouts) error {
	if err := t.Validate(); err != nil {
		return err
	}
	err := n.do(ctx, func(h *mobyipvs.Handle) error {
		return h.SetConfig(&mobyipvs.Config{TimeoutTCP: t.TCP, TimeoutTCPFin: t.TCPFin, TimeoutUDP: t.UDP})
	})
	if err != nil {
		return fmt.Errorf("setting IPVS timeouts to %s: %w", t, classify(err, 0))
	}
	return nil
}

// Timeouts is part of [Interface].
func (n *Netlink) Timeouts(ctx context.Context) (Timeouts, error) {
	var c *mobyipvs.Config
	err := n.do(ctx, func(h *mobyipvs.Handle) (err error) {
		c, err = h.GetConfig()
		return err
	})
	if err != nil {
		return Timeouts{}, fmt.Errorf("reading IPVS timeouts: %w", classify(err, 0))
	}
	return Timeouts{TCP: c.TimeoutTCP, TCPFin: c.TimeoutTCPFin, UDP: c.TimeoutUDP}, nil
}

// checkIdentity validates what identifies a virtual server.
func checkIdentity(vs VirtualServer) error {
	id := VirtualServer{Address: vs.Address, Protocol: vs.Protocol, Port: vs.Port}
	return id.Validate()
}

func family(a netip.Addr) uint16 {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// netmask is what persistence groups clients by: each address on its own.
func netmask(a netip.Addr) uint32 {
	if a.Is4() {
		return 0xffffffff
	}
	return 128
}

func toMobyService(vs VirtualServer) *mobyipvs.Service {
	vs = vs.Normalized()
	return &mobyipvs.Service{
		Address:       net.IP(vs.Address.AsSlice()),
		Protocol:      protocolNumbers[vs.Protocol],
		Port:          vs.Port,
		SchedName:     vs.Scheduler,
		Flags:         uint32(vs.Flags),
		Timeout:       vs.Timeout,
		Netmask:       netmask(vs.Address),
		AddressFamily: family(vs.Address),
	}
}

func fromMobyService(s *mobyipvs.Service) (VirtualServer, bool) {
	if s == nil || s.FWMark != 0 {
		return VirtualServer{}, false
	}
	a, ok := netip.AddrFromSlice(s.Address)
	if !ok {
		return VirtualServer{}, false
	}
	vs := VirtualServer{Address: a.Unmap(), Port: s.Port, Scheduler: s.SchedName, Flags: Flags(s.Flags), Timeout: s.Timeout}
	for p, num := range protocolNumbers {
		if num == s.Protocol {
			vs.Protocol = p
		}
	}
	if vs.Protocol == "" {
		return VirtualServer{}, false
	}
	return vs.Normalized(), true
}

func toMobyDest(rs RealServer) *mobyipvs.Destination {
	return &mobyipvs.Destination{
		Address:         net.IP(rs.Address.AsSlice()),
		Port:            rs.Port,
		Weight:          rs.Weight,
		ConnectionFlags: mobyipvs.ConnectionFlagMasq,
		AddressFamily:   family(rs.Address),
	}
}

// opError wraps the kernel's error for op with the package error that says
// what it means, keeping the kernel's error in the chain.
func opError(op Op, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", op, classify(err, op.Kind))
}

func classify(err error, k OpKind) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return err
	}
	var kind error
	switch {
	case errno == unix.EEXIST:
		kind = ErrAlreadyExists
	case errno == unix.ESRCH:
		kind = ErrNotFound
	case errno == unix.ENOENT && (k == AddVirtualServer || k == UpdateVirtualServer):
		return fmt.Errorf("%w: scheduler not available (module not loaded?) (kernel: %w)", ErrNotSupported, err)
	case errno == unix.ENOENT:
		kind = ErrNotFound
	case errno == unix.EINVAL || errno == unix.ERANGE:
		kind = ErrInvalid
	default:
		return err
	}
	return fmt.Errorf("%w (kernel: %w)", kind, err)
}

// Generic netlink constants of IPVS, from linux/ip_vs.h.
const (
	ipvsGenlVersion = 1

	cmdNewService = 1
	cmdSetService = 2
	cmdDelService = 3
	cmdNewDest    = 5
	cmdSetDest    = 6
	cmdDelDest    = 7

	attrService = 1
	attrDest    = 2

	svcAF        = 1
	svcProtocol  = 2
	svcAddr      = 3
	svcPort      = 4
	svcSchedName = 6
	svcFlags     = 7
	svcTimeout   = 8
	svcNetmask   = 9

	destAddr      = 1
	destPort      = 2
	destFwdMethod = 3
	destWeight    = 4
	destUThresh   = 5
	destLThresh   = 6

	fwdMasq = 0
)

var opCommands = map[OpKind]uint8{
	AddVirtualServer: cmdNewService, UpdateVirtualServer: cmdSetService, DeleteVirtualServer: cmdDelService,
	AddRealServer: cmdNewDest, UpdateRealServer: cmdSetDest, DeleteRealServer: cmdDelDest,
}

// ApplyBatch is part of [Batcher]. It sends up to 512 ops per system call
// (see batchSocket); one failure does not stop the ops after it.
func (n *Netlink) ApplyBatch(ctx context.Context, ops []Op) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var failed []OpError
	valid := make([]int, 0, len(ops))
	for i, op := range ops {
		if err := op.validate(); err != nil {
			failed = append(failed, OpError{Index: i, Op: op, Err: err})
			continue
		}
		valid = append(valid, i)
	}
	errs, err := n.batch.run(len(valid), func(b []byte, seq uint32, j int, ack bool) []byte {
		return n.appendOp(b, seq, ops[valid[j]], ack)
	})
	for j, e := range errs {
		i := valid[j]
		failed = append(failed, OpError{Index: i, Op: ops[i], Err: opError(ops[i], e)})
	}
	if err != nil {
		return fmt.Errorf("IPVS batch of %d ops: %w", len(ops), err)
	}
	if len(failed) == 0 {
		return nil
	}
	slices.SortFunc(failed, func(a, b OpError) int { return a.Index - b.Index })
	return &BatchError{Failed: failed}
}

// appendOp appends the generic netlink message of op to b, asking for an
// acknowledgement if ack.
func (n *Netlink) appendOp(b []byte, seq uint32, op Op, ack bool) []byte {
	start := len(b)
	b = appendHeader(b, n.family, 0, seq, ack)
	b = append(b, opCommands[op.Kind], ipvsGenlVersion, 0, 0)
	b = appendService(b, op.VirtualServer, op.Kind == AddVirtualServer || op.Kind == UpdateVirtualServer)
	if op.Kind >= AddRealServer {
		b = appendDest(b, op.RealServer, op.Kind != DeleteRealServer)
	}
	setLength(b, start)
	return b
}

func appendService(b []byte, vs VirtualServer, full bool) []byte {
	vs = vs.Normalized()
	nest := len(b)
	b = appendAttr(b, attrService, nil)
	b = appendAttr(b, svcAF, u16(family(vs.Address)))
	b = appendAttr(b, svcProtocol, u16(protocolNumbers[vs.Protocol]))
	b = appendAttr(b, svcAddr, vs.Address.AsSlice())
	b = appendAttr(b, svcPort, be16(vs.Port))
	if full {
		b = appendAttr(b, svcSchedName, append([]byte(vs.Scheduler), 0))
		b = appendAttr(b, svcFlags, append(u32(uint32(vs.Flags)), u32(0xffffffff)...))
		b = appendAttr(b, svcTimeout, u32(vs.Timeout))
		b = appendAttr(b, svcNetmask, u32(netmask(vs.Address)))
	}
	setAttrLength(b, nest)
	return b
}

func appendDest(b []byte, rs RealServer, full bool) []byte {
	nest := len(b)
	b = appendAttr(b, attrDest, nil)
	b = appendAttr(b, destAddr, rs.Address.AsSlice())
	b = appendAttr(b, destPort, be16(rs.Port))
	if full {
		b = appendAttr(b, destFwdMethod, u32(fwdMasq))
		b = appendAttr(b, destWeight, u32(uint32(rs.Weight)))
		b = appendAttr(b, destUThresh, u32(0))
		b = appendAttr(b, destLThresh, u32(0))
	}
	setAttrLength(b, nest)
	return b
}
