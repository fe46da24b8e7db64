package ipset

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Netlink is the kernel implementation of [Interface], over the ipset
// netlink protocol. It needs no ipset binary. Make one with [New] and Close
// it when done.
//
// Most requests go through vishvananda/netlink's ipset calls. Two go over a
// socket of its own, built with the same library's netlink primitives,
// because the library (v1.3.1) cannot express them: creating a set with a
// hash size, and adding, deleting or testing bitmap:port members (the
// library always sends a protocol attribute with a port, which the kernel
// refuses for bitmap:port).
type Netlink struct {
	h       *netlink.Handle
	sock    *nl.NetlinkSocket
	sockets map[int]*nl.SocketHandle
}

var _ Interface = (*Netlink)(nil)

// New opens netlink sockets in the caller's network namespace, or in the
// one given by [WithNetNSPath]. It fails if a socket cannot be opened or the
// namespace cannot be entered; it does not check that the kernel has ipset
// support (the first call does).
func New(opts ...Option) (*Netlink, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	ns := netns.None()
	if o.netnsPath != "" {
		var err error
		if ns, err = netns.GetFromPath(o.netnsPath); err != nil {
			return nil, fmt.Errorf("ipset: opening network namespace %s: %w", o.netnsPath, err)
		}
		defer ns.Close()
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("ipset: netlink socket: %w", err)
	}
	sock, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_NETFILTER)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("ipset: netlink socket: %w", err)
	}
	return &Netlink{
		h:       h,
		sock:    sock,
		sockets: map[int]*nl.SocketHandle{unix.NETLINK_NETFILTER: {Socket: sock}},
	}, nil
}

// Close closes the netlink sockets. The Netlink must not be used after.
func (n *Netlink) Close() {
	n.h.Close()
	n.sock.Close()
}

// Revisions of the set types that Create asks for: the oldest with every
// feature used here, which every kernel since 3.x has.
var revisions = map[Type]uint8{
	HashIP: 1, HashIPPort: 1, HashIPPortIP: 1, HashIPPortNet: 2, HashNet: 0, BitmapPort: 0,
}

var familyNumbers = map[Family]uint8{FamilyIPv4: unix.AF_INET, FamilyIPv6: unix.AF_INET6}

// Create is part of [Interface].
func (n *Netlink) Create(ctx context.Context, set Set) error {
	if err := set.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	d := set.WithDefaults()
	data := nl.NewRtAttr(nl.IPSET_ATTR_DATA|int(nl.NLA_F_NESTED), nil)
	var family uint8
	if d.Type == BitmapPort {
		data.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_PORT_FROM|int(nl.NLA_F_NET_BYTEORDER), be16(d.PortFrom)))
		data.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_PORT_TO|int(nl.NLA_F_NET_BYTEORDER), be16(d.PortTo)))
	} else {
		family = familyNumbers[d.Family]
		data.AddChild(&nl.Uint32Attribute{Type: nl.IPSET_ATTR_HASHSIZE | nl.NLA_F_NET_BYTEORDER, Value: d.HashSize})
		data.AddChild(&nl.Uint32Attribute{Type: nl.IPSET_ATTR_MAXELEM | nl.NLA_F_NET_BYTEORDER, Value: d.MaxElem})
	}
	err := n.request(nl.IPSET_CMD_CREATE,
		nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(d.Name)),
		nl.NewRtAttr(nl.IPSET_ATTR_TYPENAME, nl.ZeroTerminated(string(d.Type))),
		nl.NewRtAttr(nl.IPSET_ATTR_REVISION, nl.Uint8Attr(revisions[d.Type])),
		nl.NewRtAttr(nl.IPSET_ATTR_FAMILY, nl.Uint8Attr(family)),
		data)
	if err != nil {
		return fmt.Errorf("ipset %s: creating %s: %w", set.Name, d, classify(err, opCreate))
	}
	return nil
}

// Destroy is part of [Interface].
func (n *Netlink) Destroy(ctx context.Context, name string) error {
	return n.byName(ctx, name, "destroying", n.h.IpsetDestroy)
}

// Flush is part of [Interface].
func (n *Netlink) Flush(ctx context.Context, name string) error {
	return n.byName(ctx, name, "flushing", n.h.IpsetFlush)
}

// byName runs a command that takes nothing but a set name.
func (n *Netlink) byName(ctx context.Context, name, verb string, cmd func(string) error) error {
	if err := validateName(name); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := cmd(name); err != nil {
		return fmt.Errorf("ipset %s: %s: %w", name, verb, classify(err, opOther))
	}
	return nil
}

// Swap is part of [Interface].
func (n *Netlink) Swap(ctx context.Context, a, b string) error {
	if err := validateName(a); err != nil {
		return err
	}
	if err := validateName(b); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := n.h.IpsetSwap(a, b); err != nil {
		return fmt.Errorf("ipset %s: swapping with %s: %w", a, b, classify(err, opOther))
	}
	return nil
}

// Add is part of [Interface].
func (n *Netlink) Add(ctx context.Context, name string, entry Entry) error {
	return n.addDel(ctx, nl.IPSET_CMD_ADD, opAdd, name, entry)
}

// Del is part of [Interface].
func (n *Netlink) Del(ctx context.Context, name string, entry Entry) error {
	return n.addDel(ctx, nl.IPSET_CMD_DEL, opDel, name, entry)
}

func (n *Netlink) addDel(ctx context.Context, cmd int, o op, name string, entry Entry) error {
	if err := validateName(name); err != nil {
		return err
	}
	if err := entry.Validate(); err != nil {
		return fmt.Errorf("ipset %s: %w", name, err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	var err error
	switch {
	case entry.Type == BitmapPort:
		err = n.request(cmd, nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(name)), portData(entry.Port))
	case cmd == nl.IPSET_CMD_ADD:
		err = n.h.IpsetAdd(name, toNetlink(entry))
	default:
		err = n.h.IpsetDel(name, toNetlink(entry))
	}
	if err != nil {
		verb := map[op]string{opAdd: "adding", opDel: "deleting"}[o]
		return fmt.Errorf("ipset %s: %s %s: %w", name, verb, entry, classify(err, o))
	}
	return nil
}

// Test is part of [Interface].
func (n *Netlink) Test(ctx context.Context, name string, entry Entry) (bool, error) {
	if err := validateName(name); err != nil {
		return false, err
	}
	if err := entry.Validate(); err != nil {
		return false, fmt.Errorf("ipset %s: %w", name, err)
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	var (
		member bool
		err    error
	)
	if entry.Type == BitmapPort {
		err = n.request(nl.IPSET_CMD_TEST, nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(name)), portData(entry.Port))
		member = err == nil
		if isIPSetErr(err, nl.IPSET_ERR_EXIST) {
			err = nil
		}
	} else {
		member, err = n.h.IpsetTest(name, toNetlink(entry))
	}
	if err != nil {
		return false, fmt.Errorf("ipset %s: testing %s: %w", name, entry, classify(err, opTest))
	}
	return member, nil
}

// ListEntries is part of [Interface].
func (n *Netlink) ListEntries(ctx context.Context, name string) ([]Entry, error) {
	if err := validateName(name); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	res, err := n.h.IpsetList(name)
	if err != nil {
		return nil, fmt.Errorf("ipset %s: listing: %w", name, classify(err, opOther))
	}
	t := Type(res.TypeName)
	if !t.Valid() {
		return nil, fmt.Errorf("ipset %s: %w: type %q is not supported", name, ErrInvalid, res.TypeName)
	}
	entries := make([]Entry, 0, len(res.Entries))
	for i := range res.Entries {
		e, err := fromNetlink(t, &res.Entries[i])
		if err != nil {
			return nil, fmt.Errorf("ipset %s: listing: %w", name, err)
		}
		entries = append(entries, e)
	}
	return entries, nil
}

// ListSets is part of [Interface]. It dumps every member of every set, as
// the library offers no header-only listing; its cost grows with the total
// number of members in the namespace.
func (n *Netlink) ListSets(ctx context.Context) ([]SetInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	results, err := n.h.IpsetListAll()
	if err != nil {
		return nil, fmt.Errorf("ipset: listing sets: %w", classify(err, opOther))
	}
	var sets []SetInfo
	for i := range results {
		r := &results[i]
		// The kernel splits a large set over several messages; only the
		// first carries the header.
		if r.TypeName == "" {
			continue
		}
		info := SetInfo{
			Set:        Set{Name: r.SetName, Type: Type(r.TypeName)},
			NumEntries: int(r.NumEntries),
			References: int(r.References),
		}
		if info.Type == BitmapPort {
			info.PortFrom, info.PortTo = r.PortFrom, r.PortTo
		} else {
			for f, num := range familyNumbers {
				if num == r.Family {
					info.Family = f
				}
			}
			info.HashSize, info.MaxElem = r.HashSize, r.MaxElements
		}
		sets = append(sets, info)
	}
	slices.SortFunc(sets, func(a, b SetInfo) int { return strings.Compare(a.Name, b.Name) })
	return sets, nil
}

// Version is part of [Interface].
func (n *Netlink) Version(ctx context.Context) (Version, error) {
	if err := ctx.Err(); err != nil {
		return Version{}, err
	}
	p, minp, err := n.h.IpsetProtocol()
	if err != nil {
		return Version{}, fmt.Errorf("ipset: protocol version: %w", err)
	}
	return Version{Protocol: p, MinProtocol: minp}, nil
}

// request sends one ipset command over n's own socket and waits for the
// kernel's answer.
func (n *Netlink) request(cmd int, attrs ...nl.NetlinkRequestData) error {
	flags := nl.GetIpsetFlags(cmd) | unix.NLM_F_EXCL
	req := nl.NewNetlinkRequest(cmd|(unix.NFNL_SUBSYS_IPSET<<8), flags)
	req.Sockets = n.sockets
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_NETLINK, Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, nl.Uint8Attr(nl.IPSET_PROTOCOL)))
	for _, a := range attrs {
		req.AddData(a)
	}
	_, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	var errno syscall.Errno
	if errors.As(err, &errno) && int(errno) >= nl.IPSET_ERR_PRIVATE {
		return nl.IPSetError(uintptr(errno))
	}
	return err
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

func portData(port uint16) *nl.RtAttr {
	data := nl.NewRtAttr(nl.IPSET_ATTR_DATA|int(nl.NLA_F_NESTED), nil)
	data.AddChild(nl.NewRtAttr(nl.IPSET_ATTR_PORT|int(nl.NLA_F_NET_BYTEORDER), be16(port)))
	return data
}

func toNetlink(e Entry) *netlink.IPSetEntry {
	ne := &netlink.IPSetEntry{}
	if e.Addr.IsValid() {
		ne.IP = net.IP(e.Addr.AsSlice())
	}
	if e.Protocol != "" {
		p := protocolNumbers[e.Protocol]
		port := e.Port
		ne.Protocol, ne.Port = &p, &port
	}
	switch e.Type {
	case HashIPPortIP:
		ne.IP2 = net.IP(e.Addr2.AsSlice())
	case HashIPPortNet:
		ne.IP2 = net.IP(e.Net.Addr().AsSlice())
		ne.CIDR2 = uint8(e.Net.Bits())
	case HashNet:
		ne.IP = net.IP(e.Net.Addr().AsSlice())
		ne.CIDR = uint8(e.Net.Bits())
	}
	return ne
}

func fromNetlink(t Type, ne *netlink.IPSetEntry) (Entry, error) {
	e := Entry{Type: t}
	addr := func(ip net.IP) netip.Addr {
		a, _ := netip.AddrFromSlice(ip)
		return a.Unmap()
	}
	if ne.IP != nil && t != HashNet {
		e.Addr = addr(ne.IP)
	}
	if t != HashIP && t != HashNet {
		if ne.Port == nil {
			return e, fmt.Errorf("%w: a %s member without a port", ErrInvalid, t)
		}
		e.Port = *ne.Port
	}
	if t == HashIPPort || t == HashIPPortIP || t == HashIPPortNet {
		if ne.Protocol == nil {
			return e, fmt.Errorf("%w: a %s member without a protocol", ErrInvalid, t)
		}
		for p, num := range protocolNumbers {
			if num == *ne.Protocol {
				e.Protocol = p
			}
		}
		if e.Protocol == "" {
			return e, fmt.Errorf("%w: member %s,%d:%d has a protocol other than TCP, UDP and SCTP", ErrInvalid, e.Addr, *ne.Protocol, e.Port)
		}
	}
	switch t {
	case HashIPPortIP:
		e.Addr2 = addr(ne.IP2)
	case HashIPPortNet:
		e.Net = netip.PrefixFrom(addr(ne.IP2), int(ne.CIDR2))
	case HashNet:
		e.Net = netip.PrefixFrom(addr(ne.IP), int(ne.CIDR))
	}
	if err := e.validate(); err != nil {
		return e, fmt.Errorf("%w: kernel member %s: %s", ErrInvalid, e, err)
	}
	return e, nil
}

type op int

const (
	opOther op = iota
	opCreate
	opAdd
	opDel
	opTest
)

func isIPSetErr(err error, code int) bool {
	var ie nl.IPSetError
	return errors.As(err, &ie) && int(ie) == code
}

// classify wraps a kernel error with the package error that says what it
// means for operation o, keeping the kernel's error in the chain.
func classify(err error, o op) error {
	var kind error
	switch {
	case errors.Is(err, syscall.ENOENT), isIPSetErr(err, nl.IPSET_ERR_EXIST_SETNAME2):
		kind = ErrNotFound
	case errors.Is(err, syscall.EEXIST):
		kind = ErrAlreadyExists
	case isIPSetErr(err, nl.IPSET_ERR_EXIST) && o == opAdd:
		kind = ErrAlreadyExists
	case isIPSetErr(err, nl.IPSET_ERR_EXIST) && o == opDel:
		kind = ErrNotFound
	case isIPSetErr(err, nl.IPSET_ERR_BUSY), isIPSetErr(err, nl.IPSET_ERR_REFERENCED):
		kind = ErrInUse
	case isIPSetErr(err, nl.IPSET_ERR_TYPE_MISMATCH):
		kind = ErrTypeMismatch
	case isIPSetErr(err, nl.IPSET_ERR_PROTOCOL) && (o == opAdd || o == opDel || o == opTest):
		// The kernel's word for attributes that the set's type does not
		// take: an entry of another type or family.
		return fmt.Errorf("%w: the set's type or family does not take this entry (kernel: %w)", ErrInvalid, err)
	case errors.Is(err, syscall.ERANGE) || isIPSetErr(err, nl.IPSET_ERR_TYPE_SPECIFIC):
		// bitmap:port reports a port outside its range with the first
		// type-specific code.
		return fmt.Errorf("%w: outside the set's range (kernel: %w)", ErrInvalid, err)
	default:
		return err
	}
	return fmt.Errorf("%w (kernel: %w)", kind, err)
}
