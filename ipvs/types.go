package ipvs

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
)

// DefaultScheduler is the scheduler of a virtual server that names none.
const DefaultScheduler = "rr"

// DummyDevice is the name kube-proxy gives the dummy interface that holds
// the service addresses, so that the node accepts packets for them.
const DummyDevice = "kube-ipvs0"

// schedulers are the scheduler names the kernel's IPVS knows, each provided
// by the module ip_vs_NAME.
var schedulers = []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos"}

// Flags are the flags of a virtual server. The kernel also reports an
// internal "hashed" flag on every virtual server; it is removed from what
// this package returns.
type Flags uint32

// Virtual server flags, as the kernel numbers them.
const (
	// FlagPersistent sends every connection of a client to the real server
	// its first one went to, until the virtual server's Timeout passes with
	// no connection from it: the ClientIP session affinity of a Service.
	FlagPersistent Flags = 0x1
	// FlagOnePacket schedules each UDP datagram on its own.
	FlagOnePacket Flags = 0x4
	// FlagSched1, FlagSched2 and FlagSched3 are options of the scheduler:
	// for "sh", fall back to another server when the chosen one is
	// unavailable (1) and hash the source port too (2); for "mh", the same
	// two meanings.
	FlagSched1, FlagSched2, FlagSched3 Flags = 0x8, 0x10, 0x20

	// flagHashed is set by the kernel on every virtual server it holds.
	flagHashed Flags = 0x2
	knownFlags       = FlagPersistent | FlagOnePacket | FlagSched1 | FlagSched2 | FlagSched3
)

// VirtualServer is an IPVS virtual server (an "IPVS service") on an
// address, protocol and port. Those three identify it; the scheduler,
// flags and timeout are its settings. Firewall-mark virtual servers are not
// supported.
type VirtualServer struct {
	// Address is the address clients connect to.
	Address netip.Addr
	// Protocol is TCP, UDP or SCTP.
	Protocol v1.Protocol
	// Port is the port clients connect to.
	Port uint16
	// Scheduler names the scheduling algorithm; empty means
	// [DefaultScheduler].
	Scheduler string
	// Flags are the virtual server's flags.
	Flags Flags
	// Timeout is the persistence timeout in seconds, used with
	// [FlagPersistent]; the kernel reports 0 without that flag.
	Timeout uint32
}

// String returns "10.96.0.1:80/TCP" ("[fd00::1]:80/TCP" for IPv6), the
// virtual server's identity.
func (vs VirtualServer) String() string {
	return netip.AddrPortFrom(vs.Address, vs.Port).String() + "/" + string(vs.Protocol)
}

// key is a virtual server's identity, without pointers, so that maps of
// tens of thousands of them hash fast and cost the garbage collector
// nothing.
type key struct {
	addr  [16]byte
	proto uint16
	port  uint16
}

func (vs VirtualServer) key() key {
	return key{vs.Address.As16(), protocolNumbers[vs.Protocol], vs.Port}
}

// SameAs reports whether vs and o are the same virtual server: the same
// address, protocol and port, whatever their settings.
func (vs VirtualServer) SameAs(o VirtualServer) bool { return vs.key() == o.key() }

// Normalized returns vs as the kernel reports it: the default scheduler
// filled in, no timeout without [FlagPersistent], no internal flags.
func (vs VirtualServer) Normalized() VirtualServer {
	if vs.Scheduler == "" {
		vs.Scheduler = DefaultScheduler
	}
	vs.Flags &^= flagHashed
	if vs.Flags&FlagPersistent == 0 {
		vs.Timeout = 0
	}
	return vs
}

// Equal reports whether vs and o are the same virtual server with the same
// settings, as the kernel would report them (an empty scheduler equals
// [DefaultScheduler]; a timeout without [FlagPersistent] is ignored).
func (vs VirtualServer) Equal(o VirtualServer) bool { return vs.Normalized() == o.Normalized() }

// Validate returns an error naming the virtual server if it is not one the
// kernel would accept: the address must be valid (not IPv4-mapped, no
// zone), the protocol TCP, UDP or SCTP, the scheduler one IPVS knows, the
// flags known, and a persistent virtual server needs a timeout.
func (vs VirtualServer) Validate() error {
	if err := vs.validate(); err != nil {
		return fmt.Errorf("virtual server %s: %w: %s", vs, ErrInvalid, err)
	}
	return nil
}

func (vs VirtualServer) validate() error {
	if err := checkAddr(vs.Address); err != nil {
		return err
	}
	if _, ok := protocolNumbers[vs.Protocol]; !ok {
		return fmt.Errorf("protocol %q is not TCP, UDP or SCTP", vs.Protocol)
	}
	if s := vs.Scheduler; s != "" && !slices.Contains(schedulers, s) {
		return fmt.Errorf("unknown scheduler %q (known: %s)", s, strings.Join(schedulers, ", "))
	}
	if f := vs.Flags &^ flagHashed; f&^knownFlags != 0 {
		return fmt.Errorf("unknown flags %#x", uint32(f&^knownFlags))
	}
	if vs.Flags&FlagPersistent != 0 && vs.Timeout == 0 {
		return fmt.Errorf("persistent without a timeout")
	}
	return nil
}

func checkAddr(a netip.Addr) error {
	switch {
	case !a.IsValid():
		return fmt.Errorf("no address")
	case a.Is4In6():
		return fmt.Errorf("address %s is IPv4-mapped IPv6", a)
	case a.Zone() != "":
		return fmt.Errorf("address %s has a zone", a)
	}
	return nil
}

var protocolNumbers = map[v1.Protocol]uint16{v1.ProtocolTCP: 6, v1.ProtocolUDP: 17, v1.ProtocolSCTP: 132}

// RealServer is an IPVS real server (an "IPVS destination") of a virtual
// server, reached by masquerading (NAT). Address and port identify it
// within its virtual server.
type RealServer struct {
	// Address is the backend's address, of the virtual server's family.
	Address netip.Addr
	// Port is the backend's port.
	Port uint16
	// Weight is the share of new connections the server gets relative to
	// the others; 0 sends it none, which is how a server is drained.
	Weight int
	// ActiveConn and InactiveConn are the kernel's counts of the server's
	// established and other (closing, waiting) connections. They are
	// reported by listings and ignored by writes and comparisons.
	ActiveConn, InactiveConn int
}

// String returns "10.0.0.1:8080" ("[fd00::1]:8080" for IPv6).
func (rs RealServer) String() string { return netip.AddrPortFrom(rs.Address, rs.Port).String() }

// Validate returns an error naming the real server and its virtual server
// if the kernel would not accept it there: a valid address of the virtual
// server's family and a weight from 0 to 2^31-1.
func (rs RealServer) Validate(vs VirtualServer) error {
	err := checkAddr(rs.Address)
	switch {
	case err != nil:
	case rs.Address.Is4() != vs.Address.Is4():
		err = fmt.Errorf("address family differs from the virtual server's")
	case rs.Weight < 0 || rs.Weight > math.MaxInt32:
		err = fmt.Errorf("weight %d is outside 0 to %d", rs.Weight, math.MaxInt32)
	}
	if err != nil {
		return fmt.Errorf("real server %s of %s: %w: %s", rs, vs, ErrInvalid, err)
	}
	return nil
}

// Timeouts are the IPVS connection timeouts of a network namespace, as
// `ipvsadm --set` sets them. They have a granularity of one second.
type Timeouts struct {
	// TCP is the idle timeout of established TCP connections.
	TCP time.Duration
	// TCPFin is the timeout of TCP connections after a FIN.
	TCPFin time.Duration
	// UDP is the idle timeout of UDP flows.
	UDP time.Duration
}

// Validate checks that each timeout is a whole number of seconds that
// fits the kernel's 32 bits, as [Interface.SetTimeouts] does before it
// sends anything; the error wraps [ErrInvalid] and names the timeout.
func (t Timeouts) Validate() error {
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"tcp", t.TCP}, {"tcpfin", t.TCPFin}, {"udp", t.UDP}} {
		if d.d < 0 || d.d%time.Second != 0 || d.d/time.Second > math.MaxInt32 {
			return fmt.Errorf("IPVS timeouts: %w: %s timeout %s is not a whole number of seconds from 0 to 2^31-1", ErrInvalid, d.name, d.d)
		}
	}
	return nil
}

// String returns the timeouts in seconds as ipvsadm prints them:
// "tcp 900 tcpfin 120 udp 300".
func (t Timeouts) String() string {
	s := func(d time.Duration) string { return strconv.Itoa(int(d / time.Second)) }
	return "tcp " + s(t.TCP) + " tcpfin " + s(t.TCPFin) + " udp " + s(t.UDP)
}
