package ipvs

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
)

// HostAddresses returns the addresses of every interface of the binder's
// network namespace except the dummy interface dummy ("" means
// [DummyDevice]): the node's own addresses, which TranslatorConfig.NodeIPs
// wants (split by family). It leaves out IPv6 link-local addresses, which
// need a zone, and keeps loopback ones, which the Translator never serves
// node ports on. The list is sorted, IPv4 first, without repeats; a missing
// dummy interface is not an error.
func (d *DummyBinder) HostAddresses(ctx context.Context, dummy string) ([]netip.Addr, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if dummy == "" {
		dummy = DummyDevice
	}
	skip := -1
	link, err := d.link(ctx, dummy)
	switch {
	case err == nil:
		skip = link.Attrs().Index
	case !IsNotFound(err):
		return nil, err
	}
	addrs, err := d.h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("node addresses: %w", err)
	}
	list := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || a.LinkIndex == skip {
			continue
		}
		if ip = ip.Unmap(); ip.Is6() && ip.IsLinkLocalUnicast() {
			continue
		}
		list = append(list, ip)
	}
	slices.SortFunc(list, netip.Addr.Compare)
	return slices.Compact(list), nil
}
