package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/knftables"
)

// Netlink makes this package's nf_tables netlink requests, each bounded by
// Timeout: the element batches of ApplyElementBatch and ApplyElements and
// the reads of NewKernelState's and WatchKernel's KernelState. The package
// functions are the zero Netlink's methods.
type Netlink struct {
	// Timeout bounds each request, from its sending to the kernel's last
	// answer. A request not answered in time fails with an error for
	// which IsCommandTimeout is true, and its socket is closed; a batch
	// that timed out may have been committed or not. Zero means
	// DefaultCommandTimeout; less than zero, no bound.
	Timeout time.Duration
}

// timeout is n's bound, or zero for none.
func (n Netlink) timeout() time.Duration {
	switch {
	case n.Timeout == 0:
		return DefaultCommandTimeout
	case n.Timeout < 0:
		return 0
	}
	return n.Timeout
}

// ApplyElementBatch is the package's ApplyElementBatch, with n's bound.
func (n Netlink) ApplyElementBatch(b ElementBatch) error {
	return applyElementBatch(b, n.timeout())
}

// ApplyElements is the package's ApplyElements, with n's bound.
func (n Netlink) ApplyElements(elements []*knftables.Element) error {
	return n.ApplyElementBatch(ElementBatch{Add: elements})
}

// requestError is the error of the netlink request what: a
// *commandTimeout when the socket's deadline, timeout after the request
// was sent, ended it (zero: the request had no deadline).
func requestError(what string, err error, timeout time.Duration) error {
	if timeout > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
		err = fmt.Errorf("%w (%w)", &commandTimeout{after: timeout, what: "no answer"}, err)
	}
	return fmt.Errorf("nftables netlink: %s: %w", what, err)
}

// ElementBatch is a change of set and map elements that ApplyElementBatch
// sends as one nf_tables batch: SyncResult.Batch of a partial sync that
// changes nothing else (WriterConfig.NetlinkElementSyncs).
type ElementBatch struct {
	// Delete are the elements to delete, found by their keys: values and
	// comments are not sent. The kernel refuses the batch if one is not
	// there.
	Delete []*knftables.Element
	// Add are the elements to add, after the deletions. The kernel
	// refuses the batch if one's key is there with another value, and
	// takes one that is there with its value as it is.
	Add []*knftables.Element
}

// Len returns the number of elements in the batch.
func (b ElementBatch) Len() int { return len(b.Delete) + len(b.Add) }

// AddTo queues b's deletions, then its additions, on tx: the same changes
// as one nft transaction, for a knftables.Fake or a dry run.
func (b ElementBatch) AddTo(tx *knftables.Transaction) {
	for _, el := range b.Delete {
		tx.Delete(el)
	}
	for _, el := range b.Add {
		tx.Add(el)
	}
}

// ApplyElements adds elements, SyncResult.Elements of a split full sync,
// to their sets and maps in the kernel through nf_tables netlink, as one
// batch: ApplyElementBatch with these additions alone, whose rules it
// follows (on a platform without nf_tables netlink, it fails unless there
// are none).
func ApplyElements(elements []*knftables.Element) error {
	return Netlink{}.ApplyElements(elements)
}

// netlinkSets are the sets and maps whose elements ApplyElements and
// ApplyElementBatch send, with the fields of their keys and values: the
// writer's bulk. The others stay with nft: elements with comments (the
// no-endpoint maps) and interval sets (nodeport-ips, firewall-allow), whose
// encodings nft decides.
var netlinkSets = map[string]setLayout{
	endpointsMap:         {key: []field{fAddr, fProto, fPort, fIndex}, value: []field{fAddr, fPort}},
	nodePortEndpointsMap: {key: []field{fProto, fPort, fIndex}, value: []field{fAddr, fPort}},
	serviceIPsMap:        {key: []field{fAddr, fProto, fPort}, verdict: true},
	serviceNodePortsMap:  {key: []field{fProto, fPort}, verdict: true},
	clusterIPsSet:        {key: []field{fAddr}},
	hairpinSet:           {key: []field{fAddr, fAddr}},
	firewallIPsSet:       {key: []field{fAddr, fProto, fPort}},
}

// setLayout is how a set's elements are laid out: the fields of the key,
// and of the value for a map whose values are data; verdict for a map
// whose values are verdicts.
type setLayout struct {
	key, value []field
	verdict    bool
}

type field uint8

const (
	fAddr  field = iota // ipv4_addr or ipv6_addr
	fProto              // inet_proto: tcp, udp or sctp
	fPort               // inet_service
	fIndex              // numgen's result, a 32-bit integer
)

// protocolNumbers are inet_proto's values for the protocols a Service
// may name: encodeFields writes them, and the watcher's decodeFields reads
// them back through protocolNames, so that one element's two encodings
// cannot drift apart.
var protocolNumbers = map[string]byte{"tcp": 6, "udp": 17, "sctp": 132}

// netlinkElement reports whether ApplyElements and ApplyElementBatch send
// el.
func netlinkElement(el *knftables.Element) bool {
	_, ok := netlinkSets[el.Set+el.Map]
	return ok && el.Comment == nil
}

// encodedElement is an element as nft encodes it in a NEWSETELEM message.
type encodedElement struct {
	key, value []byte
	chain      string // the goto verdict's chain, for a verdict map
}

// encodeElement encodes el as nft 1.0.6 does: each field of a
// concatenation takes whole 32-bit registers (padded with zeros), ports
// are big-endian, numgen's result is a host-order integer, and a verdict
// map's value is "goto chain". It fails on an element of a set
// netlinkElement does not take, or a field it cannot read.
func encodeElement(el *knftables.Element) (encodedElement, error) {
	return encode(el, false)
}

// encodeKey encodes el's key alone, for a deletion: el is checked as by
// encodeElement, except its value, which is not read.
func encodeKey(el *knftables.Element) ([]byte, error) {
	e, err := encode(el, true)
	return e.key, err
}

func encode(el *knftables.Element, keyOnly bool) (encodedElement, error) {
	var e encodedElement
	spec, v6, err := elementLayout(el)
	if err != nil {
		return e, err
	}
	name := el.Set + el.Map
	if e.key, err = encodeFields(spec.key, el.Key, v6); err != nil {
		return e, fmt.Errorf("element %v of %s: key: %w", el.Key, name, err)
	}
	switch {
	case keyOnly:
	case spec.verdict:
		e.chain, err = gotoChain(el)
	case spec.value != nil:
		if e.value, err = encodeFields(spec.value, el.Value, v6); err != nil {
			err = fmt.Errorf("element %v of %s: value: %w", el.Key, name, err)
		}
	}
	return e, err
}

// elementLayout returns the layout of el's set and whether el is of the
// IPv6 family, or an error when el is not one netlinkElement takes, is of
// another family, or is a set's element with a value.
func elementLayout(el *knftables.Element) (setLayout, bool, error) {
	name := el.Set + el.Map
	spec, ok := netlinkSets[name]
	if !ok || el.Comment != nil || (el.Map != "") != (spec.verdict || spec.value != nil) {
		return spec, false, fmt.Errorf("element %v of %s is not sent through netlink", el.Key, name)
	}
	v6 := el.Family == knftables.IPv6Family
	if !v6 && el.Family != knftables.IPv4Family {
		return spec, false, fmt.Errorf("element %v of %s: family %q", el.Key, name, el.Family)
	}
	if !spec.verdict && spec.value == nil && len(el.Value) != 0 {
		return spec, false, fmt.Errorf("element %v of set %s has a value", el.Key, name)
	}
	return spec, v6, nil
}

// gotoChain returns the chain of a verdict map element's "goto chain". It
// refuses a chain name the kernel would read otherwise than nft: one with
// a space, a control character or NUL (which ends the name the kernel
// reads), or longer than the kernel's 255 bytes.
func gotoChain(el *knftables.Element) (string, error) {
	chain, ok := strings.CutPrefix(strings.Join(el.Value, " "), "goto ")
	ok = ok && chain != "" && len(chain) <= 255
	for i := 0; ok && i < len(chain); i++ {
		ok = chain[i] > ' ' && chain[i] != 0x7f
	}
	if !ok {
		return "", fmt.Errorf("element %v of %s: value %q is not a goto", el.Key, el.Set+el.Map, el.Value)
	}
	return chain, nil
}

func encodeFields(fields []field, parts []string, v6 bool) ([]byte, error) {
	b, err := appendFields(nil, fields, parts, v6)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// appendFields is encodeFields appending to b; on an error it returns b
// with garbage after what b held.
func appendFields(b []byte, fields []field, parts []string, v6 bool) ([]byte, error) {
	if len(parts) != len(fields) {
		return b, fmt.Errorf("%d fields, want %d", len(parts), len(fields))
	}
	for i, f := range fields {
		p := parts[i]
		switch f {
		case fAddr:
			a, err := netip.ParseAddr(p)
			if err != nil || a.Zone() != "" || a.Is6() != v6 || a.Is4In6() {
				return b, fmt.Errorf("%q is not an address of the family", p)
			}
			if v6 {
				a16 := a.As16()
				b = append(b, a16[:]...)
			} else {
				a4 := a.As4()
				b = append(b, a4[:]...)
			}
		case fProto:
			n, ok := protocolNumbers[p]
			if !ok {
				return b, fmt.Errorf("protocol %q", p)
			}
			b = append(b, n, 0, 0, 0)
		case fPort:
			n, err := strconv.ParseUint(p, 10, 16)
			if err != nil || n == 0 {
				return b, fmt.Errorf("port %q", p)
			}
			b = append(binary.BigEndian.AppendUint16(b, uint16(n)), 0, 0)
		case fIndex:
			n, err := strconv.ParseUint(p, 10, 32)
			if err != nil {
				return b, fmt.Errorf("index %q", p)
			}
			b = binary.NativeEndian.AppendUint32(b, uint32(n))
		}
	}
	return b, nil
}
