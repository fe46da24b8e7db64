package ipset

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Entry is one member of a set. Which fields are used depends on Type:
//
//	HashIP         Addr                          10.0.0.1
//	HashIPPort     Addr, Protocol, Port          10.0.0.1,tcp:80
//	HashIPPortIP   Addr, Protocol, Port, Addr2   10.0.0.1,tcp:80,10.0.0.2
//	HashIPPortNet  Addr, Protocol, Port, Net     10.0.0.1,tcp:80,10.0.0.0/24
//	HashNet        Net                           10.0.0.0/24
//	BitmapPort     Port                          80
//
// The other fields must be zero. Entries are comparable, so they can be map
// keys; two entries are the same member exactly when they are ==. Build them
// with the constructors ([IPEntry], [IPPortEntry], ...) or [ParseEntry],
// which return them in canonical form.
type Entry struct {
	// Type is the type of set the entry belongs in.
	Type Type
	// Addr is the first address of the hash:ip* types.
	Addr netip.Addr
	// Protocol is TCP, UDP or SCTP, for the types with a port other than
	// bitmap:port.
	Protocol v1.Protocol
	// Port is the port of the types with one.
	Port uint16
	// Addr2 is the second address of hash:ip,port,ip.
	Addr2 netip.Addr
	// Net is the network of hash:net and hash:ip,port,net, masked to its
	// length.
	Net netip.Prefix
}

// IPEntry returns a hash:ip entry.
func IPEntry(addr netip.Addr) Entry { return Entry{Type: HashIP, Addr: addr} }

// IPPortEntry returns a hash:ip,port entry.
func IPPortEntry(addr netip.Addr, protocol v1.Protocol, port uint16) Entry {
	return Entry{Type: HashIPPort, Addr: addr, Protocol: protocol, Port: port}
}

// IPPortIPEntry returns a hash:ip,port,ip entry.
func IPPortIPEntry(addr netip.Addr, protocol v1.Protocol, port uint16, addr2 netip.Addr) Entry {
	return Entry{Type: HashIPPortIP, Addr: addr, Protocol: protocol, Port: port, Addr2: addr2}
}

// IPPortNetEntry returns a hash:ip,port,net entry; net is masked to its
// length, as the kernel stores it.
func IPPortNetEntry(addr netip.Addr, protocol v1.Protocol, port uint16, net netip.Prefix) Entry {
	return Entry{Type: HashIPPortNet, Addr: addr, Protocol: protocol, Port: port, Net: net.Masked()}
}

// NetEntry returns a hash:net entry; net is masked to its length, as the
// kernel stores it.
func NetEntry(net netip.Prefix) Entry { return Entry{Type: HashNet, Net: net.Masked()} }

// PortEntry returns a bitmap:port entry.
func PortEntry(port uint16) Entry { return Entry{Type: BitmapPort, Port: port} }

// protocolNumbers are the IP protocol numbers of the protocols entries
// may name.
var protocolNumbers = map[v1.Protocol]uint8{v1.ProtocolTCP: 6, v1.ProtocolUDP: 17, v1.ProtocolSCTP: 132}

func protocolName(p v1.Protocol) string { return strings.ToLower(string(p)) }

// String returns the entry in the syntax of the ipset binary, as in the
// table on [Entry]. IPv6 addresses are not bracketed ("fd00::1,tcp:80"). An
// entry of an unknown type prints as "<TYPE?>".
func (e Entry) String() string {
	var b strings.Builder
	e.write(&b)
	return b.String()
}

func (e Entry) write(b *strings.Builder) {
	switch e.Type {
	case HashIP:
		b.WriteString(e.Addr.String())
	case HashIPPort, HashIPPortIP, HashIPPortNet:
		b.WriteString(e.Addr.String())
		b.WriteByte(',')
		b.WriteString(protocolName(e.Protocol))
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(int(e.Port)))
		switch e.Type {
		case HashIPPortIP:
			b.WriteByte(',')
			b.WriteString(e.Addr2.String())
		case HashIPPortNet:
			b.WriteByte(',')
			b.WriteString(e.Net.String())
		}
	case HashNet:
		b.WriteString(e.Net.String())
	case BitmapPort:
		b.WriteString(strconv.Itoa(int(e.Port)))
	default:
		b.WriteString("<" + string(e.Type) + "?>")
	}
}

// Family returns the address family of the entry, or "" for a bitmap:port
// entry or one with no address.
func (e Entry) Family() Family {
	a := e.Addr
	if !a.IsValid() {
		a = e.Net.Addr()
	}
	switch {
	case !a.IsValid():
		return ""
	case a.Is4():
		return FamilyIPv4
	default:
		return FamilyIPv6
	}
}

// Validate returns an error naming the entry if it is malformed: a field
// its type needs is missing or invalid, a field its type does not use is
// set, its addresses are of mixed families, a network is not masked to its
// length or has length zero, or an address is IPv4-mapped IPv6 or has a
// zone. A valid entry may still be refused by a set of another type or
// family; see [Set.Check].
func (e Entry) Validate() error {
	if err := e.validate(); err != nil {
		return fmt.Errorf("ipset entry %s: %w: %s", e, ErrInvalid, err)
	}
	return nil
}

func (e Entry) validate() error {
	var (
		needAddr, needProto, needAddr2, needNet bool
	)
	switch e.Type {
	case HashIP:
		needAddr = true
	case HashIPPort:
		needAddr, needProto = true, true
	case HashIPPortIP:
		needAddr, needProto, needAddr2 = true, true, true
	case HashIPPortNet:
		needAddr, needProto, needNet = true, true, true
	case HashNet:
		needNet = true
	case BitmapPort:
	default:
		return fmt.Errorf("unknown type %q", e.Type)
	}
	if err := checkAddr("address", e.Addr, needAddr); err != nil {
		return err
	}
	if err := checkAddr("second address", e.Addr2, needAddr2); err != nil {
		return err
	}
	if needProto {
		if _, ok := protocolNumbers[e.Protocol]; !ok {
			return fmt.Errorf("protocol %q is not TCP, UDP or SCTP", e.Protocol)
		}
	} else if e.Protocol != "" {
		return fmt.Errorf("%s takes no protocol", e.Type)
	}
	if !needProto && e.Type != BitmapPort && e.Port != 0 {
		return fmt.Errorf("%s takes no port", e.Type)
	}
	if needNet {
		if !e.Net.IsValid() {
			return fmt.Errorf("%s needs a network", e.Type)
		}
		if err := checkAddr("network", e.Net.Addr(), true); err != nil {
			return err
		}
		if e.Net.Bits() == 0 {
			return fmt.Errorf("network %s has length zero", e.Net)
		}
		if e.Net != e.Net.Masked() {
			return fmt.Errorf("network %s is not masked to its length (%s)", e.Net, e.Net.Masked())
		}
	} else if e.Net.IsValid() {
		return fmt.Errorf("%s takes no network", e.Type)
	}
	fam := e.Family()
	for _, a := range []netip.Addr{e.Addr2, e.Net.Addr()} {
		if a.IsValid() && a.Is4() != (fam == FamilyIPv4) {
			return fmt.Errorf("mixes IPv4 and IPv6")
		}
	}
	return nil
}

func checkAddr(what string, a netip.Addr, need bool) error {
	switch {
	case !need && a.IsValid():
		return fmt.Errorf("takes no %s", what)
	case need && !a.IsValid():
		return fmt.Errorf("needs an %s", what)
	case !need:
		return nil
	case a.Is4In6():
		return fmt.Errorf("%s %s is IPv4-mapped IPv6", what, a)
	case a.Zone() != "":
		return fmt.Errorf("%s %s has a zone", what, a)
	}
	return nil
}

// Check returns an error naming the entry and the set if the entry is
// malformed ([Entry.Validate]) or cannot be a member of s: its type or
// family differs from the set's, or its port is outside a bitmap:port
// set's range.
func (s Set) Check(e Entry) error {
	if err := e.Validate(); err != nil {
		return fmt.Errorf("ipset %s: %w", s.Name, err)
	}
	d := s.WithDefaults()
	if e.Type != d.Type {
		return fmt.Errorf("ipset %s: %w: entry %s is a %s entry, the set is %s", s.Name, ErrInvalid, e, e.Type, d.Type)
	}
	if e.Type == BitmapPort {
		if e.Port < d.PortFrom || e.Port > d.PortTo {
			return fmt.Errorf("ipset %s: %w: port %d is outside the range %d-%d", s.Name, ErrInvalid, e.Port, d.PortFrom, d.PortTo)
		}
		return nil
	}
	if e.Family() != d.Family {
		return fmt.Errorf("ipset %s: %w: entry %s is not of family %s", s.Name, ErrInvalid, e, d.Family)
	}
	return nil
}

// ParseEntry parses an entry of a set of type t from the syntax of the ipset
// binary (the table on [Entry]), as `ipset list` prints members. A network
// without a length is a host network (/32 or /128); one that is not masked
// to its length is masked, as the kernel does. Protocols are lower case.
// Anything else that does not fit t is an error naming s.
func ParseEntry(t Type, s string) (Entry, error) {
	e, err := parseEntry(t, s)
	if err != nil {
		return Entry{}, fmt.Errorf("ipset entry %q for %s: %w: %s", s, t, ErrInvalid, err)
	}
	if err := e.validate(); err != nil {
		return Entry{}, fmt.Errorf("ipset entry %q for %s: %w: %s", s, t, ErrInvalid, err)
	}
	return e, nil
}

func parseEntry(t Type, s string) (Entry, error) {
	e := Entry{Type: t}
	parts := strings.Split(s, ",")
	want := map[Type]int{HashIP: 1, HashIPPort: 2, HashIPPortIP: 3, HashIPPortNet: 3, HashNet: 1, BitmapPort: 1}[t]
	if want == 0 {
		return e, fmt.Errorf("unknown type")
	}
	if len(parts) != want {
		return e, fmt.Errorf("has %d comma-separated parts, want %d", len(parts), want)
	}
	var err error
	switch t {
	case HashNet:
		e.Net, err = parseNet(parts[0])
		return e, err
	case BitmapPort:
		e.Port, err = parsePort(parts[0])
		return e, err
	}
	if e.Addr, err = netip.ParseAddr(parts[0]); err != nil {
		return e, err
	}
	if t == HashIP {
		return e, nil
	}
	name, port, ok := strings.Cut(parts[1], ":")
	if !ok {
		return e, fmt.Errorf("%q is not PROTOCOL:PORT", parts[1])
	}
	e.Protocol = v1.Protocol(strings.ToUpper(name))
	if _, known := protocolNumbers[e.Protocol]; !known || name != strings.ToLower(name) {
		return e, fmt.Errorf("unknown protocol %q", name)
	}
	if e.Port, err = parsePort(port); err != nil {
		return e, err
	}
	switch t {
	case HashIPPortIP:
		e.Addr2, err = netip.ParseAddr(parts[2])
	case HashIPPortNet:
		e.Net, err = parseNet(parts[2])
	}
	return e, err
}

func parseNet(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return p.Masked(), nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("port %q is not a number from 0 to 65535", s)
	}
	return uint16(n), nil
}

// Compare orders entries: by type in the order of [Types] (unknown types
// last, by name), then address, protocol, port, second address and network,
// addresses in numeric order (IPv4 before IPv6). It returns -1, 0 or +1,
// and 0 exactly when the entries are ==.
func (e Entry) Compare(o Entry) int {
	if c := cmp.Compare(typeRank(e.Type), typeRank(o.Type)); c != 0 {
		return c
	}
	if c := strings.Compare(string(e.Type), string(o.Type)); c != 0 {
		return c
	}
	if c := e.Addr.Compare(o.Addr); c != 0 {
		return c
	}
	if c := strings.Compare(string(e.Protocol), string(o.Protocol)); c != 0 {
		return c
	}
	if c := cmp.Compare(e.Port, o.Port); c != 0 {
		return c
	}
	if c := e.Addr2.Compare(o.Addr2); c != 0 {
		return c
	}
	if c := e.Net.Addr().Compare(o.Net.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(e.Net.Bits(), o.Net.Bits())
}

func typeRank(t Type) int {
	if i := slices.Index(types, t); i >= 0 {
		return i
	}
	return len(types)
}
