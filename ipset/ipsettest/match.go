package ipsettest

import (
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipset"
)

// HasSet reports whether a set named name exists. It is what
// iptablestest.WithIPSetFake needs to refuse a rule naming a missing set,
// as the kernel does.
func (f *Fake) HasSet(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.sets[name]
	return ok
}

// MatchPacket reports whether a packet matches the named set as the
// kernel's set match ("-m set --match-set NAME DIRS") decides. dims holds,
// for each direction of DIRS in order, the packet's address and port on
// that side: its source for "src", its destination for "dst". protocol is
// the packet's transport protocol, empty for one without ports.
//
// Each dimension of the set's type takes the next element of dims:
// hash:ip the address; hash:ip,port the address, then the port (with the
// protocol); hash:ip,port,ip and hash:ip,port,net a third address, equal
// to the member's second address or inside its network; hash:net an
// address inside a member's network; bitmap:port a port. As in the kernel,
// fewer dims than the type has dimensions never match (extra ones are
// ignored), an address of the other family never matches, and a type with
// a port matches only TCP, UDP and SCTP packets (bitmap:port any of the
// three; the others only the member's protocol).
//
// It returns an error wrapping [ipset.ErrNotFound] if the set does not
// exist. It does not count as a call of [ipset.Interface].
func (f *Fake) MatchPacket(name string, protocol v1.Protocol, dims []netip.AddrPort) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.sets[name]
	if !ok {
		return false, fmt.Errorf("ipset %s: %w", name, ipset.ErrNotFound)
	}
	typ := s.set.Type
	if len(dims) < dimensions(typ) {
		return false, nil
	}
	hasPort := protocol == v1.ProtocolTCP || protocol == v1.ProtocolUDP || protocol == v1.ProtocolSCTP
	if typ == ipset.BitmapPort {
		p := dims[0].Port()
		_, member := s.entries[ipset.PortEntry(p)]
		return hasPort && member, nil
	}
	family := s.set.Family
	if family == "" {
		family = ipset.FamilyIPv4
	}
	for _, d := range dims[:dimensions(typ)] {
		if d.Addr().Is4() != (family == ipset.FamilyIPv4) {
			return false, nil
		}
	}
	if typ != ipset.HashIP && typ != ipset.HashNet && !hasPort {
		return false, nil
	}
	addr := dims[0].Addr()
	switch typ {
	case ipset.HashIP:
		_, member := s.entries[ipset.IPEntry(addr)]
		return member, nil
	case ipset.HashIPPort:
		_, member := s.entries[ipset.IPPortEntry(addr, protocol, dims[1].Port())]
		return member, nil
	case ipset.HashIPPortIP:
		_, member := s.entries[ipset.IPPortIPEntry(addr, protocol, dims[1].Port(), dims[2].Addr())]
		return member, nil
	case ipset.HashIPPortNet:
		return containsNet(s, dims[2].Addr(), func(n netip.Prefix) ipset.Entry {
			return ipset.IPPortNetEntry(addr, protocol, dims[1].Port(), n)
		}), nil
	case ipset.HashNet:
		return containsNet(s, addr, ipset.NetEntry), nil
	}
	return false, fmt.Errorf("ipset %s: matching a packet against type %s: %w", name, typ, ipset.ErrInvalid)
}

// dimensions is the number of directions a set type's match reads.
func dimensions(t ipset.Type) int {
	switch t {
	case ipset.HashIPPort:
		return 2
	case ipset.HashIPPortIP, ipset.HashIPPortNet:
		return 3
	}
	return 1
}

// containsNet reports whether s has the member entry(n) for a network n
// that holds a, trying each prefix length as the kernel's hash:net does.
func containsNet(s *fakeSet, a netip.Addr, entry func(netip.Prefix) ipset.Entry) bool {
	for bits := a.BitLen(); bits >= 0; bits-- {
		n, err := a.Prefix(bits)
		if err != nil {
			continue
		}
		if _, ok := s.entries[entry(n)]; ok {
			return true
		}
	}
	return false
}
