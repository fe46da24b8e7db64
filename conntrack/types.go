package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	v1 "k8s.io/api/core/v1"
)

// ErrNotSupported is wrapped by the errors of every method of the Interface
// New returns on an operating system other than Linux; the error names the
// operating system. Callers test for it with [IsNotSupported].
var ErrNotSupported = errors.New("conntrack: not supported")

// IsNotSupported reports whether err, or an error it wraps, is
// [ErrNotSupported].
func IsNotSupported(err error) bool {
	return errors.Is(err, ErrNotSupported)
}

// Interface lists and deletes flows of the kernel's connection tracking
// table, one IP family at a time. Implementations are safe for concurrent
// use.
type Interface interface {
	// ListFlows returns every flow of family in the table, in no
	// particular order. An empty table gives an empty list and no error.
	ListFlows(ctx context.Context, family v1.IPFamily) ([]Flow, error)
	// DeleteFlows deletes the flows of family that are equal to one of
	// flows (same zone, protocol, original and reply tuples) and returns
	// how many it deleted. Flows no longer in the table are skipped, not
	// errors; flows of another family never match. A nil or empty list
	// deletes nothing and does not touch the kernel.
	DeleteFlows(ctx context.Context, family v1.IPFamily, flows []Flow) (int, error)
}

// Protocol is an IANA IP protocol number, as conntrack records it.
type Protocol uint8

// The protocols a proxy deals with.
const (
	// ProtocolTCP is TCP.
	ProtocolTCP Protocol = 6
	// ProtocolUDP is UDP.
	ProtocolUDP Protocol = 17
	// ProtocolSCTP is SCTP.
	ProtocolSCTP Protocol = 132
	// ProtocolICMP is ICMP.
	ProtocolICMP Protocol = 1
	// ProtocolICMPv6 is ICMPv6.
	ProtocolICMPv6 Protocol = 58
)

// String returns the name conntrack -L prints ("udp"), or the number for
// other protocols.
func (p Protocol) String() string {
	switch p {
	case ProtocolTCP:
		return "tcp"
	case ProtocolUDP:
		return "udp"
	case ProtocolSCTP:
		return "sctp"
	case ProtocolICMP:
		return "icmp"
	case ProtocolICMPv6:
		return "icmpv6"
	}
	return strconv.Itoa(int(p))
}

// protocolOf returns the conntrack protocol of a Service port protocol.
func protocolOf(p v1.Protocol) (Protocol, bool) {
	switch p {
	case v1.ProtocolTCP:
		return ProtocolTCP, true
	case v1.ProtocolUDP:
		return ProtocolUDP, true
	case v1.ProtocolSCTP:
		return ProtocolSCTP, true
	}
	return 0, false
}

// Tuple is one direction of a flow: source and destination address and,
// for TCP, UDP and SCTP, ports (zero for other protocols).
type Tuple struct {
	// Src and Dst are the source and destination addresses.
	Src, Dst netip.Addr
	// SrcPort and DstPort are the ports, 0 for protocols without ports.
	SrcPort, DstPort uint16
}

// Flow is one conntrack entry: what the first packet looked like
// (Original) and what a reply is expected to look like (Reply). After DNAT
// to an endpoint, Reply.Src is the endpoint; without NAT, Reply.Src equals
// Original.Dst.
type Flow struct {
	// Protocol is the layer-4 protocol.
	Protocol Protocol
	// Original is the tuple of the packet that created the flow, as it
	// arrived (before DNAT).
	Original Tuple
	// Reply is the tuple a reply is expected to have (after DNAT, its
	// source is the endpoint).
	Reply Tuple
	// Zone is the conntrack zone, 0 by default.
	Zone uint16
}

// String renders the flow as conntrack -L does, without counters and
// timeouts: "udp src=10.0.0.2 dst=10.96.0.10 sport=40000 dport=53
// src=10.0.1.2 dst=10.0.0.2 sport=5353 dport=40000", with " zone=N" when
// the zone is not 0.
func (f Flow) String() string {
	s := fmt.Sprintf("%s src=%s dst=%s sport=%d dport=%d src=%s dst=%s sport=%d dport=%d",
		f.Protocol, f.Original.Src, f.Original.Dst, f.Original.SrcPort, f.Original.DstPort,
		f.Reply.Src, f.Reply.Dst, f.Reply.SrcPort, f.Reply.DstPort)
	if f.Zone != 0 {
		s += " zone=" + strconv.Itoa(int(f.Zone))
	}
	return s
}

// familyOf reports whether a is an address of family, treating an
// IPv4-mapped IPv6 address as IPv4.
func familyOf(a netip.Addr, family v1.IPFamily) bool {
	a = a.Unmap()
	switch family {
	case v1.IPv4Protocol:
		return a.Is4()
	case v1.IPv6Protocol:
		return a.Is6()
	}
	return false
}

// checkFamily returns an error for a family other than IPv4 or IPv6.
func checkFamily(family v1.IPFamily) error {
	if family != v1.IPv4Protocol && family != v1.IPv6Protocol {
		return fmt.Errorf("conntrack: unknown IP family %q", family)
	}
	return nil
}

// flowKey identifies a flow: everything DeleteFlows compares.
type flowKey struct {
	proto            Protocol
	zone             uint16
	origSrc, origDst netip.Addr
	origSP, origDP   uint16
	replySrc         netip.Addr
	replyDst         netip.Addr
	replySP, replyDP uint16
}

func (f Flow) key() flowKey {
	return flowKey{
		proto: f.Protocol, zone: f.Zone,
		origSrc: f.Original.Src.Unmap(), origDst: f.Original.Dst.Unmap(),
		origSP: f.Original.SrcPort, origDP: f.Original.DstPort,
		replySrc: f.Reply.Src.Unmap(), replyDst: f.Reply.Dst.Unmap(),
		replySP: f.Reply.SrcPort, replyDP: f.Reply.DstPort,
	}
}
