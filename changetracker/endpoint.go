package changetracker

import (
	"bytes"
	"cmp"
	"net/netip"
	"strconv"
	"sync/atomic"
	"unsafe"

	"k8s.io/apimachinery/pkg/util/sets"
)

// Endpoint is what a proxier needs to know about one backend of one
// ServicePortName: an address and port with its conditions and topology. The
// tracker builds a BaseEndpoint for each and hands it to the MakeEndpointFunc,
// which may wrap it in a type of its own that embeds *BaseEndpoint.
//
// Values are immutable once built; sets returned by the methods are shared and
// must not be modified.
type Endpoint interface {
	// String returns "ip:port", e.g. "10.0.0.1:8080" or "[fd00::1]:8080".
	String() string
	// IP returns the endpoint's address.
	IP() netip.Addr
	// Port returns the endpoint's port number.
	Port() int
	// IsLocal reports whether the endpoint runs on the tracker's node. Always
	// false when the tracker was given no node name.
	IsLocal() bool
	// IsReady reports the endpoint's ready condition (true when unset).
	IsReady() bool
	// IsServing reports the endpoint's serving condition (true when unset).
	IsServing() bool
	// IsTerminating reports the endpoint's terminating condition (false when
	// unset).
	IsTerminating() bool
	// ZoneHints returns the zones the endpoint is hinted for; empty (nil)
	// when the endpoint has no zone hints.
	ZoneHints() sets.Set[string]
	// NodeHints returns the nodes the endpoint is hinted for; empty (nil)
	// when the endpoint has no node hints.
	NodeHints() sets.Set[string]
	// NodeName returns the node the endpoint runs on, "" when unknown.
	NodeName() string
	// Zone returns the zone the endpoint runs in, "" when unknown.
	Zone() string
}

// MakeEndpointFunc turns the BaseEndpoint built for one endpoint of one
// service port into the Endpoint stored in the EndpointsMap. It is called from
// EndpointsMap.Update, on the sync goroutine. Returning nil drops the
// endpoint. A nil MakeEndpointFunc stores the *BaseEndpoint itself.
type MakeEndpointFunc func(info *BaseEndpoint, svcPortName *ServicePortName) Endpoint

// BaseEndpoint is the tracker's own Endpoint. Embed *BaseEndpoint in a type of
// your own to add fields; its methods then satisfy Endpoint. The tracker
// allocates the BaseEndpoints of one service port together, so keep pointers
// to them rather than copies.
type BaseEndpoint struct {
	ip        netip.Addr
	port      int32
	flags     endpointFlags
	nodeName  string
	zone      string
	zoneHints sets.Set[string]
	nodeHints sets.Set[string]
	// str caches String() as a *string, read and written atomically:
	// formatting every endpoint eagerly would dominate the cost of an initial
	// load, and many proxiers never ask. (Not an atomic.Pointer, whose
	// no-copy marker would forbid the value copies the tracker makes while
	// sorting, before any String call.)
	str unsafe.Pointer
}

type endpointFlags uint8

const (
	flagLocal endpointFlags = 1 << iota
	flagReady
	flagServing
	flagTerminating
)

var _ Endpoint = (*BaseEndpoint)(nil)

// EndpointInfo describes an endpoint for NewBaseEndpoint.
type EndpointInfo struct {
	// IP and Port are where the endpoint listens.
	IP   netip.Addr
	Port int
	// NodeName and Zone are where the endpoint runs; either may be empty.
	NodeName string
	Zone     string
	// IsLocal says the endpoint runs on the proxy's own node.
	IsLocal bool
	// Ready, Serving and Terminating are the EndpointSlice conditions.
	Ready       bool
	Serving     bool
	Terminating bool
	// ZoneHints and NodeHints are the topology hints: the zones and nodes
	// that should use this endpoint. They may be nil. They are kept, not
	// copied.
	ZoneHints sets.Set[string]
	NodeHints sets.Set[string]
}

// NewBaseEndpoint builds a BaseEndpoint from info. It is meant for tests of
// proxiers and for code that does not get its endpoints from EndpointSlices;
// the tracker builds its own. A port outside 0..65535 is stored as 0.
func NewBaseEndpoint(info EndpointInfo) *BaseEndpoint {
	ep := &BaseEndpoint{
		ip:        info.IP,
		nodeName:  info.NodeName,
		zone:      info.Zone,
		zoneHints: info.ZoneHints,
		nodeHints: info.NodeHints,
	}
	if info.Port > 0 && info.Port <= 65535 {
		ep.port = int32(info.Port)
	}
	if info.IsLocal {
		ep.flags |= flagLocal
	}
	if info.Ready {
		ep.flags |= flagReady
	}
	if info.Serving {
		ep.flags |= flagServing
	}
	if info.Terminating {
		ep.flags |= flagTerminating
	}
	return ep
}

// String is part of Endpoint. The string is built on first use and cached.
func (e *BaseEndpoint) String() string {
	if p := atomic.LoadPointer(&e.str); p != nil {
		return *(*string)(p)
	}
	s := endpointString(e.ip, int(e.port))
	atomic.StorePointer(&e.str, unsafe.Pointer(&s))
	return s
}

func endpointString(ip netip.Addr, port int) string {
	return string(appendHostPort(make([]byte, 0, 48), ip, port))
}

// appendHostPort appends "ip:port", with brackets around an IPv6 address.
func appendHostPort(b []byte, ip netip.Addr, port int) []byte {
	if ip.Is6() {
		b = append(b, '[')
		b = ip.AppendTo(b)
		b = append(b, ']')
	} else {
		b = ip.AppendTo(b)
	}
	b = append(b, ':')
	return strconv.AppendInt(b, int64(port), 10)
}

// CompareHostPort orders two endpoints as their String() forms ("ip:port",
// "[ip]:port" for IPv6) compare as strings, which is the order kube-proxy
// keeps a service's endpoints in (so "10.0.0.10:80" sorts before
// "10.0.0.2:80"). EndpointsMap lists are sorted this way, so that a proxier
// built on them programs its endpoint chains in kube-proxy's order and
// rule dumps of both can be compared. It returns a negative number, zero
// or a positive number, like strings.Compare, and allocates nothing.
//
// For one port number, the order of two addresses does not depend on the
// port, because the text after the address starts with the same separator.
func CompareHostPort(a netip.Addr, aPort int, b netip.Addr, bPort int) int {
	if a == b {
		if aPort == bPort {
			return 0
		}
		var ab, bb [8]byte
		return bytes.Compare(strconv.AppendInt(ab[:0], int64(aPort), 10), strconv.AppendInt(bb[:0], int64(bPort), 10))
	}
	if a.Is4() && b.Is4() {
		// Different addresses differ before the ':' that ends them, so
		// the ports do not matter.
		return cmp.Compare(ipv4TextKey(a), ipv4TextKey(b))
	}
	var ab, bb [64]byte
	return bytes.Compare(appendHostPort(ab[:0], a, aPort), appendHostPort(bb[:0], b, bPort))
}

// ipv4TextKey encodes the text "a.b.c.d:" of an IPv4 address, one character
// per 4 bits from the top (at most 16 characters), so that keys compare as
// the texts do: '.' sorts before the digits and ':' after them, and a
// shorter text, padded with zeros, before any text it is a prefix of.
// Sorting by it costs no formatting.
func ipv4TextKey(ip netip.Addr) uint64 {
	const dot, digit0, colon = 1, 2, 12
	var key uint64
	shift := 64
	put := func(c uint64) {
		shift -= 4
		key |= c << shift
	}
	for i, o := range ip.As4() {
		if i > 0 {
			put(dot)
		}
		if o >= 100 {
			put(digit0 + uint64(o/100))
		}
		if o >= 10 {
			put(digit0 + uint64(o/10%10))
		}
		put(digit0 + uint64(o%10))
	}
	put(colon)
	return key
}

func compareHostPort(a netip.Addr, aPort int32, b netip.Addr, bPort int32) int {
	return CompareHostPort(a, int(aPort), b, int(bPort))
}

// IP is part of Endpoint.
func (e *BaseEndpoint) IP() netip.Addr { return e.ip }

// Port is part of Endpoint.
func (e *BaseEndpoint) Port() int { return int(e.port) }

// IsLocal is part of Endpoint.
func (e *BaseEndpoint) IsLocal() bool { return e.flags&flagLocal != 0 }

// IsReady is part of Endpoint.
func (e *BaseEndpoint) IsReady() bool { return e.flags&flagReady != 0 }

// IsServing is part of Endpoint.
func (e *BaseEndpoint) IsServing() bool { return e.flags&flagServing != 0 }

// IsTerminating is part of Endpoint.
func (e *BaseEndpoint) IsTerminating() bool { return e.flags&flagTerminating != 0 }

// ZoneHints is part of Endpoint.
func (e *BaseEndpoint) ZoneHints() sets.Set[string] { return e.zoneHints }

// NodeHints is part of Endpoint.
func (e *BaseEndpoint) NodeHints() sets.Set[string] { return e.nodeHints }

// NodeName is part of Endpoint.
func (e *BaseEndpoint) NodeName() string { return e.nodeName }

// Zone is part of Endpoint.
func (e *BaseEndpoint) Zone() string { return e.zone }

// sameAs reports whether two base endpoints carry the same data. Hint sets are
// compared by content.
func (e *BaseEndpoint) sameAs(o *BaseEndpoint) bool {
	return e.ip == o.ip && e.port == o.port && e.flags == o.flags &&
		e.nodeName == o.nodeName && e.zone == o.zone &&
		e.zoneHints.Equal(o.zoneHints) && e.nodeHints.Equal(o.nodeHints)
}
