package ipset

import (
	"fmt"
	"math/bits"
)

// Type is an ipset type, named as the kernel and the ipset binary name it.
type Type string

// The set types an IPVS-mode proxier uses.
const (
	// HashIP holds single addresses: "10.0.0.1".
	HashIP Type = "hash:ip"
	// HashIPPort holds address, protocol and port: "10.0.0.1,tcp:80".
	HashIPPort Type = "hash:ip,port"
	// HashIPPortIP holds address, protocol, port and a second address:
	// "10.0.0.1,tcp:80,10.0.0.2".
	HashIPPortIP Type = "hash:ip,port,ip"
	// HashIPPortNet holds address, protocol, port and a network:
	// "10.0.0.1,tcp:80,10.0.0.0/24".
	HashIPPortNet Type = "hash:ip,port,net"
	// HashNet holds networks: "10.0.0.0/24".
	HashNet Type = "hash:net"
	// BitmapPort holds ports of a fixed range: "80".
	BitmapPort Type = "bitmap:port"
)

var types = []Type{HashIP, HashIPPort, HashIPPortIP, HashIPPortNet, HashNet, BitmapPort}

// Types returns every set type this package supports, in a fixed order. The
// slice is new on each call.
func Types() []Type { return append([]Type(nil), types...) }

// Valid reports whether t is one of the supported types.
func (t Type) Valid() bool { return typeRank(t) < len(types) }

// IsHash reports whether t is one of the hash types, which have a family, a
// hash size and a maximum number of elements.
func (t Type) IsHash() bool { return t.Valid() && t != BitmapPort }

// features is the set of element dimensions of a type, as the kernel
// records them: two sets can be swapped only when their features and
// families are equal.
func (t Type) features() uint8 {
	const (
		ip = 1 << iota
		port
		ip2
		nomatch
	)
	switch t {
	case HashIP:
		return ip
	case HashIPPort:
		return ip | port
	case HashIPPortIP:
		return ip | port | ip2
	case HashIPPortNet:
		return ip | port | ip2 | nomatch
	case HashNet:
		return ip | nomatch
	case BitmapPort:
		return port
	}
	return 0
}

// Family is the address family of a hash set, named as ipset names it.
type Family string

// Address families of hash sets.
const (
	// FamilyIPv4 holds IPv4 addresses and networks.
	FamilyIPv4 Family = "inet"
	// FamilyIPv6 holds IPv6 addresses and networks.
	FamilyIPv6 Family = "inet6"
)

// Limits and defaults of the kernel.
const (
	// MaxNameLen is the longest set name the kernel accepts, in bytes.
	MaxNameLen = 31
	// DefaultHashSize is the hash size of a hash set created with none.
	DefaultHashSize = 1024
	// DefaultMaxElem is the element limit of a hash set created with none.
	DefaultMaxElem = 65536
	// minHashSize is the smallest hash size the kernel uses.
	minHashSize = 64
)

// Set describes an ipset: its name, type and the options it is created
// with. The zero value of an option means the kernel's default.
type Set struct {
	// Name is the set's name, 1 to [MaxNameLen] bytes of printable ASCII
	// without spaces.
	Name string
	// Type is the set type.
	Type Type
	// Family is the address family of a hash set; empty means
	// [FamilyIPv4]. It must be empty for [BitmapPort].
	Family Family
	// HashSize is the initial number of hash buckets of a hash set; zero
	// means [DefaultHashSize]. The kernel rounds it up to a power of two of
	// at least 64 and doubles it as the set grows, so the value a listing
	// reports is at least the one asked for. It must be zero for
	// [BitmapPort].
	HashSize uint32
	// MaxElem is the maximum number of elements of a hash set; zero means
	// [DefaultMaxElem]. It must be zero for [BitmapPort].
	MaxElem uint32
	// PortFrom and PortTo are the inclusive port range of a [BitmapPort]
	// set; both zero means the whole range 0-65535. They must be zero for
	// hash types.
	PortFrom, PortTo uint16
}

// String returns the set as an `ipset create` line without the command:
// "NAME TYPE family inet hashsize 1024 maxelem 65536" or
// "NAME bitmap:port range 0-65535", with defaults filled in.
func (s Set) String() string {
	d := s.WithDefaults()
	if d.Type == BitmapPort {
		return fmt.Sprintf("%s %s range %d-%d", d.Name, d.Type, d.PortFrom, d.PortTo)
	}
	return fmt.Sprintf("%s %s family %s hashsize %d maxelem %d", d.Name, d.Type, d.Family, d.HashSize, d.MaxElem)
}

// Validate returns an error naming the set if it is not one the kernel
// would create as described.
func (s Set) Validate() error {
	if err := validateName(s.Name); err != nil {
		return err
	}
	if !s.Type.Valid() {
		return fmt.Errorf("ipset %s: %w: unknown type %q", s.Name, ErrInvalid, s.Type)
	}
	if s.Type == BitmapPort {
		if s.Family != "" || s.HashSize != 0 || s.MaxElem != 0 {
			return fmt.Errorf("ipset %s: %w: %s takes no family, hash size or maximum", s.Name, ErrInvalid, s.Type)
		}
		if s.PortFrom > s.PortTo {
			return fmt.Errorf("ipset %s: %w: port range %d-%d is reversed", s.Name, ErrInvalid, s.PortFrom, s.PortTo)
		}
		return nil
	}
	if s.Family != "" && s.Family != FamilyIPv4 && s.Family != FamilyIPv6 {
		return fmt.Errorf("ipset %s: %w: unknown family %q", s.Name, ErrInvalid, s.Family)
	}
	if s.PortFrom != 0 || s.PortTo != 0 {
		return fmt.Errorf("ipset %s: %w: %s takes no port range", s.Name, ErrInvalid, s.Type)
	}
	if s.HashSize > 1<<31 {
		return fmt.Errorf("ipset %s: %w: hash size %d is too large", s.Name, ErrInvalid, s.HashSize)
	}
	return nil
}

func validateName(name string) error {
	if name == "" {
		return fmt.Errorf("ipset: %w: empty set name", ErrInvalid)
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("ipset %s: %w: name longer than %d bytes", name, ErrInvalid, MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("ipset %q: %w: name has a space or a non-printable byte", name, ErrInvalid)
		}
	}
	return nil
}

// WithDefaults returns s with every zero option replaced by the value the
// kernel uses, as a listing of a new set reports it: family inet, hash size
// rounded as the kernel rounds it, maximum 65536, port range 0-65535. It
// does not validate s.
func (s Set) WithDefaults() Set {
	if s.Type == BitmapPort {
		if s.PortFrom == 0 && s.PortTo == 0 {
			s.PortTo = 65535
		}
		return s
	}
	if s.Family == "" {
		s.Family = FamilyIPv4
	}
	s.HashSize = roundHashSize(s.HashSize)
	if s.MaxElem == 0 {
		s.MaxElem = DefaultMaxElem
	}
	return s
}

// roundHashSize returns the hash size the kernel makes of h.
func roundHashSize(h uint32) uint32 {
	if h == 0 {
		return DefaultHashSize
	}
	if h < minHashSize {
		return minHashSize
	}
	if h&(h-1) == 0 {
		return h
	}
	return 1 << bits.Len32(h)
}

// Replaces reports whether s, a wanted set, differs from the existing set
// have in a way that needs a new set: another type, family, maximum or port
// range, or a hash size larger than the one have reports. A hash size
// smaller than have's is not a difference, since the kernel grows hash sizes
// on its own. Names are not compared.
func (s Set) Replaces(have Set) bool {
	w, h := s.WithDefaults(), have.WithDefaults()
	if w.Type != h.Type || w.Family != h.Family || w.MaxElem != h.MaxElem ||
		w.PortFrom != h.PortFrom || w.PortTo != h.PortTo {
		return true
	}
	return w.HashSize > h.HashSize
}

// Swappable reports whether the kernel can swap sets a and b: they must
// store the same element dimensions in the same family.
func Swappable(a, b Set) bool {
	a, b = a.WithDefaults(), b.WithDefaults()
	return a.Type.features() == b.Type.features() && a.Family == b.Family
}
