package changetracker

import (
	"errors"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
	utilnet "k8s.io/utils/net"
)

var (
	errHeadless     = errors.New("headless service")
	errExternalName = errors.New("ExternalName service")
	errNoClusterIP  = errors.New("no cluster IP")
)

// parseAddr parses an IP address the way the API server accepts it: strictly
// first, then "sloppily" (IPv4 octets with leading zeros, which old API
// servers let through; kubernetes#108074). IPv4-mapped IPv6 addresses are
// unmapped, so that they count as IPv4 as they do in the rest of Kubernetes.
func parseAddr(s string) (netip.Addr, bool) {
	if ip, err := netip.ParseAddr(s); err == nil {
		if ip.Zone() != "" {
			return netip.Addr{}, false
		}
		return ip.Unmap(), true
	}
	legacy := utilnet.ParseIPSloppy(s)
	if legacy == nil {
		return netip.Addr{}, false
	}
	ip, ok := netip.AddrFromSlice(legacy)
	if !ok {
		return netip.Addr{}, false
	}
	return ip.Unmap(), true
}

// parsePrefix parses a CIDR, accepting the same legacy forms as parseAddr.
// The prefix is masked, so "10.0.0.1/8" becomes 10.0.0.0/8.
func parsePrefix(s string) (netip.Prefix, bool) {
	if p, err := netip.ParsePrefix(s); err == nil {
		if p.Addr().Is4In6() {
			bits := p.Bits() - 96
			if bits < 0 {
				return netip.Prefix{}, false
			}
			p = netip.PrefixFrom(p.Addr().Unmap(), bits)
		}
		return p.Masked(), true
	}
	if !strings.Contains(s, "/") {
		return netip.Prefix{}, false
	}
	_, legacy, err := utilnet.ParseCIDRSloppy(s)
	if err != nil || legacy == nil {
		return netip.Prefix{}, false
	}
	ip, ok := netip.AddrFromSlice(legacy.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := legacy.Mask.Size()
	ip = ip.Unmap()
	if ip.Is4() && ones > 32 {
		ones -= 96
	}
	p, err := ip.Prefix(ones)
	if err != nil {
		return netip.Prefix{}, false
	}
	return p, true
}

// familyOf returns the IP family of an address; "" for the zero Addr.
func familyOf(ip netip.Addr) v1.IPFamily {
	switch {
	case ip.Is4():
		return v1.IPv4Protocol
	case ip.Is6():
		return v1.IPv6Protocol
	}
	return ""
}

// ParseCIDR parses a CIDR the way the API server accepts one in an
// object's spec (a ServiceCIDR's, say): strictly, or with the IPv4 octets
// with leading zeros that old API servers let through
// (kubernetes#108074). The prefix is masked ("10.0.0.1/8" is 10.0.0.0/8),
// and an IPv4-mapped IPv6 prefix is taken as IPv4. It reports false for
// anything else, an address without a length included.
func ParseCIDR(s string) (netip.Prefix, bool) { return parsePrefix(s) }

// ParseAddr parses an IP address the way the trackers read one in a
// Service or an EndpointSlice: strictly, or with the IPv4 octets with
// leading zeros that old API servers let through (kubernetes#108074). An
// IPv4-mapped IPv6 address is returned as IPv4. It reports false for
// anything else, an address with a zone included. A caller that matches
// the API's address strings to the trackers' Endpoint.IP values needs it
// to agree with them on every form.
func ParseAddr(s string) (netip.Addr, bool) { return parseAddr(s) }
