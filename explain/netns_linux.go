package explain

import (
	"fmt"
	"net/netip"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	v1 "k8s.io/api/core/v1"
)

// inNetNS runs fn on an OS thread inside the network namespace at path
// ("" runs it where the caller is). Commands fn starts run there too.
func inNetNS(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", path, err)
	}
	defer ns.Close()
	done := make(chan error, 1)
	go func() {
		// The thread is never unlocked: it ends with this goroutine
		// rather than going back to the pool in another namespace.
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			done <- fmt.Errorf("entering network namespace %s: %w", path, err)
			return
		}
		done <- fn()
	}()
	return <-done
}

// NodeAddresses returns the addresses of family on the interfaces of the
// network namespace at netnsPath ("" for the caller's), which a node's
// rules call local: the addresses Node.Addrs wants. Loopback addresses
// are left out (the tracers always take them as local).
func NodeAddresses(netnsPath string, family v1.IPFamily) ([]netip.Addr, error) {
	nlFamily := netlink.FAMILY_V4
	if family == v1.IPv6Protocol {
		nlFamily = netlink.FAMILY_V6
	}
	var out []netip.Addr
	err := inNetNS(netnsPath, func() error {
		addrs, err := netlink.AddrList(nil, nlFamily)
		if err != nil {
			return fmt.Errorf("listing the node's addresses: %w", err)
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			if ip.IsLoopback() || ip.IsLinkLocalUnicast() {
				continue
			}
			out = append(out, ip)
		}
		return nil
	})
	return out, err
}
