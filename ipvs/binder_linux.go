package ipvs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// DummyBinder is the kernel implementation of [AddressBinder], over
// rtnetlink. Make one with [NewDummyBinder] and Close it when done.
type DummyBinder struct {
	h     *netlink.Handle
	batch *batchSocket

	mu    sync.Mutex
	links map[string]netlink.Link // looked up once: a lookup per address doubles the cost of binding thousands
}

var _ AddressBinder = (*DummyBinder)(nil)

// NewDummyBinder opens an rtnetlink socket in the caller's network
// namespace, or in the one [WithNetNSPath] names; it reads no other option.
func NewDummyBinder(opts ...Option) (*DummyBinder, error) {
	netnsPath := newOptions(opts).netnsPath
	ns := netns.None()
	if netnsPath != "" {
		var err error
		if ns, err = netns.GetFromPath(netnsPath); err != nil {
			return nil, fmt.Errorf("dummy interface: opening network namespace %s: %w", netnsPath, err)
		}
		defer ns.Close()
	}
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("dummy interface: rtnetlink socket: %w", err)
	}
	batch, err := newBatchSocket(ns, unix.NETLINK_ROUTE)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("dummy interface: rtnetlink socket: %w", err)
	}
	return &DummyBinder{h: h, batch: batch, links: map[string]netlink.Link{}}, nil
}

// Close closes the sockets. The DummyBinder must not be used after.
func (d *DummyBinder) Close() {
	d.h.Close()
	d.batch.close()
}

// cached returns the link called name, looked up once and remembered.
// withLink drops it when an operation on it fails with ENODEV.
func (d *DummyBinder) cached(ctx context.Context, name string) (netlink.Link, error) {
	d.mu.Lock()
	link, ok := d.links[name]
	d.mu.Unlock()
	if ok {
		return link, nil
	}
	link, err := d.link(ctx, name)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.links[name] = link
	d.mu.Unlock()
	return link, nil
}

func (d *DummyBinder) forget(name string) {
	d.mu.Lock()
	delete(d.links, name)
	d.mu.Unlock()
}

// withLink runs fn on the link called name; if the remembered link is gone
// (recreated under another index), it looks the name up again and retries
// once.
func (d *DummyBinder) withLink(ctx context.Context, name string, fn func(netlink.Link) error) error {
	for attempt := 0; ; attempt++ {
		link, err := d.cached(ctx, name)
		if err != nil {
			return err
		}
		err = fn(link)
		if !errors.Is(err, unix.ENODEV) || attempt > 0 {
			return err
		}
		d.forget(name)
	}
}

func (d *DummyBinder) link(ctx context.Context, name string) (netlink.Link, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if name == "" || len(name) >= unix.IFNAMSIZ {
		return nil, fmt.Errorf("dummy interface %q: %w: name must have 1 to %d bytes", name, ErrInvalid, unix.IFNAMSIZ-1)
	}
	link, err := d.h.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil, fmt.Errorf("dummy interface %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("dummy interface %s: %w", name, err)
	}
	return link, nil
}

// EnsureDevice is part of [AddressBinder]. The interface is left down, as
// kube-proxy leaves it: the kernel accepts packets for its addresses all the
// same, and no IPv6 link-local address appears on it.
func (d *DummyBinder) EnsureDevice(ctx context.Context, name string) (bool, error) {
	link, err := d.link(ctx, name)
	switch {
	case err == nil && link.Type() != "dummy":
		return false, fmt.Errorf("dummy interface %s: a %s link of that name exists", name, link.Type())
	case err == nil:
		d.mu.Lock()
		d.links[name] = link
		d.mu.Unlock()
		return false, nil
	case !IsNotFound(err):
		return false, err
	}
	d.forget(name)
	if err := d.h.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
		return false, fmt.Errorf("dummy interface %s: creating: %w", name, err)
	}
	return true, nil
}

// DeleteDevice is part of [AddressBinder].
func (d *DummyBinder) DeleteDevice(ctx context.Context, name string) error {
	link, err := d.link(ctx, name)
	if IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	d.forget(name)
	if err := d.h.LinkDel(link); err != nil {
		return fmt.Errorf("dummy interface %s: deleting: %w", name, err)
	}
	return nil
}

// Addresses is part of [AddressBinder].
func (d *DummyBinder) Addresses(ctx context.Context, name string) ([]netip.Addr, error) {
	// The link is looked up anew, not taken from the cache: a dump of
	// addresses filtered by a link that another program has deleted is
	// empty rather than an error, which would report a missing interface
	// as one with no addresses.
	d.forget(name)
	var addrs []netlink.Addr
	err := d.withLink(ctx, name, func(link netlink.Link) (err error) {
		addrs, err = d.h.AddrList(link, netlink.FAMILY_ALL)
		return err
	})
	if IsNotFound(err) || errors.Is(err, ErrInvalid) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("dummy interface %s: listing addresses: %w", name, err)
	}
	list := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		if ip = ip.Unmap(); ip.Is6() && ip.IsLinkLocalUnicast() {
			continue
		}
		list = append(list, ip)
	}
	return list, nil
}

// Bind is part of [AddressBinder]. It sends up to 512 addresses per
// system call.
func (d *DummyBinder) Bind(ctx context.Context, name string, addrs ...netip.Addr) error {
	return d.change(ctx, name, addrs, true)
}

// Unbind is part of [AddressBinder]. It sends up to 512 addresses per
// system call.
func (d *DummyBinder) Unbind(ctx context.Context, name string, addrs ...netip.Addr) error {
	return d.change(ctx, name, addrs, false)
}

func (d *DummyBinder) change(ctx context.Context, name string, addrs []netip.Addr, bind bool) error {
	verb, prep := "binding", "to"
	if !bind {
		verb, prep = "unbinding", "from"
	}
	var failed []error
	valid := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if err := checkAddr(a); err != nil {
			failed = append(failed, fmt.Errorf("%s %s %s %s: %w: %s", verb, a, prep, name, ErrInvalid, err))
			continue
		}
		valid = append(valid, a)
	}
	if len(valid) == 0 {
		return errors.Join(failed...)
	}
	var errs map[int]error
	err := d.withLink(ctx, name, func(link netlink.Link) error {
		var err error
		errs, err = d.batch.run(len(valid), func(b []byte, seq uint32, i int, ack bool) []byte {
			return appendAddrMsg(b, seq, ack, bind, link.Attrs().Index, valid[i])
		})
		if err != nil {
			return err
		}
		if len(errs) == len(valid) && errors.Is(errs[0], unix.ENODEV) {
			return unix.ENODEV // the interface is gone: look it up again
		}
		return nil
	})
	if IsNotFound(err) || errors.Is(err, ErrInvalid) {
		return err
	}
	if err != nil {
		return fmt.Errorf("%s %d addresses %s %s: %w", verb, len(valid), prep, name, err)
	}
	for i := range valid {
		e, ok := errs[i]
		if !ok {
			continue
		}
		switch {
		case bind && errors.Is(e, unix.EEXIST):
			e = ErrAlreadyExists
		case !bind && (errors.Is(e, unix.EADDRNOTAVAIL) || errors.Is(e, unix.ENOENT)):
			e = ErrNotFound
		}
		failed = append(failed, fmt.Errorf("%s %s %s %s: %w", verb, valid[i], prep, name, e))
	}
	return errors.Join(failed...)
}

// appendAddrMsg appends an RTM_NEWADDR (bind) or RTM_DELADDR message for
// the host address a on the interface with index ifindex. IPv6 addresses
// skip duplicate address detection, so they are usable at once.
func appendAddrMsg(b []byte, seq uint32, ack, bind bool, ifindex int, a netip.Addr) []byte {
	start := len(b)
	typ, flags := uint16(unix.RTM_DELADDR), uint16(0)
	if bind {
		typ, flags = unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL
	}
	b = appendHeader(b, typ, flags, seq, ack)
	family, ifaFlags := byte(unix.AF_INET), byte(0)
	if a.Is6() {
		family, ifaFlags = unix.AF_INET6, unix.IFA_F_NODAD
	}
	b = append(b, family, byte(a.BitLen()), ifaFlags, unix.RT_SCOPE_UNIVERSE)
	b = binary.NativeEndian.AppendUint32(b, uint32(ifindex))
	b = appendAttr(b, unix.IFA_LOCAL, a.AsSlice())
	b = appendAttr(b, unix.IFA_ADDRESS, a.AsSlice())
	setLength(b, start)
	return b
}
