package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/netlinkbuf"
)

// NewKernelState returns a KernelState that reads nf_tables over netlink
// in the network namespace at netnsPath (a bind-mounted namespace such as
// /run/netns/NAME, or /proc/PID/ns/net; "" for the namespace of the thread
// that makes each socket), opened anew for each socket. It never lists a set by dumping it, which costs the kernel
// time quadratic in the set's size: CheckElements looks each key up
// (BENCHMARKS.md).
//
// Generation, which a writer calls twice a sync, keeps its socket open
// between calls; one that fails is closed and dialled again once, in the
// same namespace for a netnsPath (with "", in the namespace of the thread
// that calls then, as every socket of RuleCounts and CheckElements is
// made). The KernelState is also an io.Closer: Close closes that socket,
// after which Generation fails. Its methods may be called from several
// goroutines.
//
// Each request waits for the kernel's answer at most
// DefaultCommandTimeout (Netlink.KernelState sets another bound); then
// the method fails with an error for which IsCommandTimeout is true, and
// Generation's socket is closed, not read again.
func NewKernelState(netnsPath string) KernelState { return Netlink{}.KernelState(netnsPath) }

// KernelState is NewKernelState with n's bound on each request.
func (n Netlink) KernelState(netnsPath string) KernelState {
	return &netlinkState{netns: netnsPath, timeout: n.Timeout}
}

// WatchKernel is the package's WatchKernel, with n's bound on each
// request of the KernelState methods (the watch of nf_tables' commits
// waits for them as long as it runs).
func (n Netlink) WatchKernel(netnsPath string) (*KernelWatcher, error) {
	w, err := WatchKernel(netnsPath)
	if err != nil {
		return nil, err
	}
	w.setTimeout(n.Timeout)
	return w, nil
}

type netlinkState struct {
	// netns is the namespace's path; "" for the calling thread's.
	netns string
	// timeout is the Netlink.Timeout of the requests (zero: the
	// default); see limit.
	timeout time.Duration
	// dialConn, when set, makes the sockets instead of netlink.Dial: for
	// tests.
	dialConn func() (*netlink.Conn, error)
	// mu guards gen, the socket Generation keeps, and genClosed.
	mu        sync.Mutex
	gen       *netlink.Conn
	genClosed bool
}

// errStateClosed is Generation's error after Close.
var errStateClosed = errors.New("nftables netlink: the KernelState is closed")

// Close closes the socket Generation keeps. It is safe to call more than
// once.
func (s *netlinkState) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.genClosed = true
	if s.gen == nil {
		return nil
	}
	err := s.gen.Close()
	s.gen = nil
	return err
}

// setTimeout sets the Netlink.Timeout of the requests, before the first
// of them that is not the one WatchKernel makes itself (with the default
// bound).
func (s *netlinkState) setTimeout(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.timeout = d
}

// limit is the bound of each request, zero for none.
func (s *netlinkState) limit() time.Duration { return Netlink{Timeout: s.timeout}.timeout() }

// bound sets the deadline of conn's next request.
func (s *netlinkState) bound(conn *netlink.Conn) error {
	d := s.limit()
	if d <= 0 {
		return nil
	}
	if err := conn.SetDeadline(time.Now().Add(d)); err != nil {
		return fmt.Errorf("nftables netlink: %w", err)
	}
	return nil
}

// execute sends one request of type msg on conn and returns the replies,
// within the socket deadline (Netlink.Timeout): every read of the table
// goes through it, so none waits for ever on a peer that does not answer.
// A failure is wrapped with what (requestError); the kernel's errno stays
// reachable with errors.Is.
func (s *netlinkState) execute(conn *netlink.Conn, msg int, flags netlink.HeaderFlags, family byte, attrs *netlink.AttributeEncoder, what string) ([]netlink.Message, error) {
	req, err := nftMsg(msg, flags, family, attrs)
	if err != nil {
		return nil, err
	}
	if err := s.bound(conn); err != nil {
		return nil, err
	}
	msgs, err := conn.Execute(req)
	if err != nil {
		return nil, requestError(what, err, s.limit())
	}
	return msgs, nil
}

func (s *netlinkState) dial() (*netlink.Conn, error) {
	if s.dialConn != nil {
		return s.dialConn()
	}
	var cfg netlink.Config
	if s.netns != "" {
		// The socket keeps its namespace; the file is needed only to
		// make it there.
		fd, err := unix.Open(s.netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("nftables netlink: opening network namespace %s: %w", s.netns, err)
		}
		defer unix.Close(fd)
		cfg.NetNS = fd
	}
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &cfg)
	if err != nil {
		return nil, fmt.Errorf("nftables netlink: dialing nf_tables: %w", err)
	}
	return conn, nil
}

func nftMsg(msg int, flags netlink.HeaderFlags, family byte, attrs *netlink.AttributeEncoder) (netlink.Message, error) {
	// struct nfgenmsg: family, version, resource id.
	data := []byte{family, unix.NFNETLINK_V0, 0, 0}
	if attrs != nil {
		b, err := attrs.Encode()
		if err != nil {
			return netlink.Message{}, err
		}
		data = append(data, b...)
	}
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | msg), Flags: netlink.Request | flags},
		Data:   data,
	}, nil
}

func nfproto(f knftables.Family) (byte, error) {
	switch f {
	case knftables.IPv4Family:
		return unix.NFPROTO_IPV4, nil
	case knftables.IPv6Family:
		return unix.NFPROTO_IPV6, nil
	}
	return 0, fmt.Errorf("nftables netlink: family %q", f)
}

// Generation reads NFT_MSG_GETGEN on the socket it keeps. A kept socket
// whose request fails (closed, or its replies out of step after an
// interrupted read) is replaced by a new one, once; an error on a new one
// is returned, and the next call dials again. A request that timed out
// is not tried again: the kernel that did not answer it would not answer
// the next in time either.
func (s *netlinkState) Generation() (uint32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.genClosed {
		return 0, errStateClosed
	}
	for {
		fresh := s.gen == nil
		if fresh {
			conn, err := s.dial()
			if err != nil {
				return 0, err
			}
			s.gen = conn
		}
		g, err := s.readGeneration(s.gen)
		if err == nil {
			return g, nil
		}
		s.gen.Close()
		s.gen = nil
		if fresh || IsCommandTimeout(err) {
			return 0, err
		}
	}
}

func (s *netlinkState) readGeneration(conn *netlink.Conn) (uint32, error) {
	req, err := nftMsg(unix.NFT_MSG_GETGEN, 0, unix.AF_UNSPEC, nil)
	if err != nil {
		return 0, err
	}
	if err := s.bound(conn); err != nil {
		return 0, err
	}
	msgs, err := conn.Execute(req)
	if err != nil {
		return 0, requestError("reading the generation", err, s.limit())
	}
	for _, m := range msgs {
		if v, ok := attr(m.Data, unix.NFTA_GEN_ID); ok && len(v) == 4 {
			return binary.BigEndian.Uint32(v), nil
		}
	}
	return 0, errors.New("nftables netlink: reading the generation: no NFTA_GEN_ID in the reply")
}

// attr returns the first top-level attribute of type typ of a nf_tables
// message's payload (after its nfgenmsg).
func attr(data []byte, typ uint16) ([]byte, bool) {
	if len(data) < 4 {
		return nil, false
	}
	v, ok, err := nestedAttr(data[4:], typ)
	return v, ok && err == nil
}

func attrString(data []byte, typ uint16) string {
	v, _ := attr(data, typ)
	return strings.TrimRight(string(v), "\x00")
}

// RuleCounts asks for the table, then dumps its chains and its rules
// (counted by chain, not decoded).
func (s *netlinkState) RuleCounts(family knftables.Family, table string) (map[string]int, error) {
	fam, conn, err := s.dialFamily(family)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	named := func(typ uint16) *netlink.AttributeEncoder {
		ae := netlink.NewAttributeEncoder()
		ae.String(typ, table)
		return ae
	}
	// No acknowledgement asked: the reply is the table or an error, and
	// an acknowledgement left behind would answer the next request.
	if _, err := s.execute(conn, unix.NFT_MSG_GETTABLE, 0, fam, named(unix.NFTA_TABLE_NAME), fmt.Sprintf("reading table %s %s", family, table)); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("table %s %s: %w", family, table, ErrTableNotFound)
		}
		return nil, err
	}
	counts := map[string]int{}
	msgs, err := s.execute(conn, unix.NFT_MSG_GETCHAIN, netlink.Dump, fam, named(unix.NFTA_CHAIN_TABLE), fmt.Sprintf("listing the chains of %s %s", family, table))
	if err != nil {
		return nil, err
	}
	for _, m := range msgs {
		if attrString(m.Data, unix.NFTA_CHAIN_TABLE) == table {
			counts[attrString(m.Data, unix.NFTA_CHAIN_NAME)] = 0
		}
	}
	msgs, err = s.execute(conn, unix.NFT_MSG_GETRULE, netlink.Dump, fam, named(unix.NFTA_RULE_TABLE), fmt.Sprintf("listing the rules of %s %s", family, table))
	if err != nil {
		return nil, err
	}
	for _, m := range msgs {
		if attrString(m.Data, unix.NFTA_RULE_TABLE) == table {
			counts[attrString(m.Data, unix.NFTA_RULE_CHAIN)]++
		}
	}
	return counts, nil
}

// checkSets are the sets and maps CheckElements reads: those ApplyElements
// writes, and the no-endpoint verdict maps (whose comments are not
// compared).
var checkSets = func() map[string]setLayout {
	m := maps.Clone(netlinkSets)
	m[noEndpointServicesMap] = netlinkSets[serviceIPsMap]
	m[noEndpointNodePortsMap] = netlinkSets[serviceNodePortsMap]
	return m
}()

// lookupBatch is how many keys one GETSETELEM request asks for.
const lookupBatch = 256

// CheckElements looks every element's key up, lookupBatch keys per
// request, and compares the value the kernel returns with the element's
// (as the kernel encodes it).
func (s *netlinkState) CheckElements(elements []*knftables.Element) ([]ElementState, error) {
	type item struct {
		i          int
		key, value []byte
	}
	bySet := map[setID][]item{}
	var order []setID
	for i, el := range elements {
		name := el.Set + el.Map
		spec, ok := checkSets[name]
		if !ok {
			return nil, fmt.Errorf("nftables netlink: elements of %s cannot be checked", name)
		}
		v6 := el.Family == knftables.IPv6Family
		key, err := encodeFields(spec.key, el.Key, v6)
		if err != nil {
			return nil, fmt.Errorf("element %v of %s: key: %w", el.Key, name, err)
		}
		var value []byte
		switch {
		case spec.verdict:
			if value, err = encodeVerdict(el.Value); err != nil {
				return nil, fmt.Errorf("element %v of %s: %w", el.Key, name, err)
			}
		case spec.value != nil:
			if value, err = encodeFields(spec.value, el.Value, v6); err != nil {
				return nil, fmt.Errorf("element %v of %s: value: %w", el.Key, name, err)
			}
		}
		id := setID{el.Family, el.Table, name}
		if bySet[id] == nil {
			order = append(order, id)
		}
		bySet[id] = append(bySet[id], item{i, key, value})
	}
	out := make([]ElementState, len(elements))
	if len(elements) == 0 {
		return out, nil
	}
	conn, err := s.dial()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// The kernel answers every key with its own message, queued at once:
	// a request's answers (about 2 KB each in the receive buffer's
	// accounting) must fit, past the rmem_max cap (root only).
	if err := forceReadBuffer(conn, 4<<20); err != nil {
		return nil, err
	}
	for _, id := range order {
		fam, err := nfproto(id.family)
		if err != nil {
			return nil, err
		}
		items := bySet[id]
		keys := make([][]byte, len(items))
		for i, it := range items {
			keys[i] = it.key
		}
		got, err := lookupKeys(conn, s.bound, fam, id.table, id.name, keys)
		if err != nil {
			return nil, requestError(fmt.Sprintf("looking up elements of %s %s %s", id.family, id.table, id.name), err, s.limit())
		}
		for i, it := range items {
			switch {
			case got[i] == nil:
				out[it.i] = ElementMissing
			case string(got[i]) != string(it.value):
				out[it.i] = ElementDiffers
			}
		}
	}
	return out, nil
}

// encodeVerdict encodes a verdict map's value as elementData returns the
// kernel's: "V" and the verdict code, then the chain for a jump or goto.
func encodeVerdict(value []string) ([]byte, error) {
	v := strings.Join(value, " ")
	// NF_DROP and NF_ACCEPT, from linux/netfilter.h.
	const nfDrop, nfAccept = 0, 1
	var code int32
	chain := ""
	switch {
	case v == "drop":
		code = nfDrop
	case v == "accept":
		code = nfAccept
	case strings.HasPrefix(v, "goto "):
		code, chain = unix.NFT_GOTO, strings.TrimPrefix(v, "goto ")
	case strings.HasPrefix(v, "jump "):
		code, chain = unix.NFT_JUMP, strings.TrimPrefix(v, "jump ")
	default:
		return nil, fmt.Errorf("verdict %q", v)
	}
	return verdictBytes(uint32(code), chain), nil
}

func verdictBytes(code uint32, chain string) []byte {
	return append(binary.BigEndian.AppendUint32([]byte{'V'}, code), chain...)
}

// lookupKeys asks the kernel for each key of set, lookupBatch per
// request, and returns what elementData makes of each answer: nil for a
// key the set does not hold, an empty value for a set's element. The
// kernel answers a request key by key and stops at the first it does not
// find, so a request that fails so is asked again key by key. bound sets
// the deadline of each request.
func lookupKeys(conn *netlink.Conn, bound func(*netlink.Conn) error, family byte, table, set string, keys [][]byte) ([][]byte, error) {
	out := make([][]byte, len(keys))
	for start := 0; start < len(keys); start += lookupBatch {
		chunk := keys[start:min(start+lookupBatch, len(keys))]
		vals, err := getElements(conn, bound, family, table, set, chunk)
		if errors.Is(err, unix.ENOENT) {
			for i := range chunk {
				v, err := getElements(conn, bound, family, table, set, chunk[i:i+1])
				if errors.Is(err, unix.ENOENT) {
					continue
				}
				if err != nil {
					return nil, err
				}
				out[start+i] = v[0]
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		copy(out[start:], vals)
	}
	return out, nil
}

func getElements(conn *netlink.Conn, bound func(*netlink.Conn) error, family byte, table, set string, keys [][]byte) ([][]byte, error) {
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
	ae.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(list *netlink.AttributeEncoder) error {
		for _, k := range keys {
			list.Nested(unix.NFTA_LIST_ELEM, func(elem *netlink.AttributeEncoder) error {
				elem.Nested(unix.NFTA_SET_ELEM_KEY, func(key *netlink.AttributeEncoder) error {
					key.Bytes(unix.NFTA_DATA_VALUE, k)
					return nil
				})
				return nil
			})
		}
		return nil
	})
	req, err := nftMsg(unix.NFT_MSG_GETSETELEM, netlink.Acknowledge, family, ae)
	if err != nil {
		return nil, err
	}
	if err := bound(conn); err != nil {
		return nil, err
	}
	if _, err := conn.Send(req); err != nil {
		return nil, err
	}
	var vals [][]byte
	for {
		msgs, err := conn.Receive()
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.Header.Type == netlink.Error {
				if len(vals) != len(keys) {
					return nil, fmt.Errorf("%d answers to %d keys", len(vals), len(keys))
				}
				return vals, nil
			}
			v, err := elementData(m.Data)
			if err != nil {
				return nil, err
			}
			vals = append(vals, v)
		}
	}
}

// elementData extracts the data of the one element of a NEWSETELEM
// message: its NFTA_DATA_VALUE, a verdict as verdictBytes encodes it, or
// an empty (non-nil) value for a set's element.
func elementData(b []byte) ([]byte, error) {
	if len(b) < 4 {
		return nil, errors.New("short set element message")
	}
	d, ok, err := nestedAttr(b[4:], unix.NFTA_SET_ELEM_LIST_ELEMENTS, unix.NFTA_LIST_ELEM, unix.NFTA_SET_ELEM_DATA)
	if err != nil || !ok {
		return []byte{}, err
	}
	if v, ok, err := nestedAttr(d, unix.NFTA_DATA_VALUE); ok || err != nil {
		return v, err
	}
	vd, ok, err := nestedAttr(d, unix.NFTA_DATA_VERDICT)
	if err != nil || !ok {
		return []byte{}, err
	}
	var code uint32 // NF_DROP when the kernel names none
	c, ok, err := nestedAttr(vd, unix.NFTA_VERDICT_CODE)
	switch {
	case err != nil:
		return nil, err
	case ok && len(c) != 4:
		return nil, fmt.Errorf("verdict code of %d bytes", len(c))
	case ok:
		code = binary.BigEndian.Uint32(c)
	}
	chain, _, err := nestedAttr(vd, unix.NFTA_VERDICT_CHAIN)
	if err != nil {
		return nil, err
	}
	return verdictBytes(code, strings.TrimRight(string(chain), "\x00")), nil
}

// nestedAttr follows path down the attribute list b, taking at each level
// the first attribute of the path's type, and returns the payload it
// reaches; false if one is missing, an error if a list cannot be read.
func nestedAttr(b []byte, path ...uint16) ([]byte, bool, error) {
	for _, typ := range path {
		ad, err := netlink.NewAttributeDecoder(b)
		if err != nil {
			return nil, false, err
		}
		found := false
		for !found && ad.Next() {
			if ad.Type() == typ {
				b, found = ad.Bytes(), true
			}
		}
		if err := ad.Err(); err != nil {
			return nil, false, err
		}
		if !found {
			return nil, false, nil
		}
	}
	return b, true, nil
}

func forceReadBuffer(conn *netlink.Conn, size int) error {
	if err := netlinkbuf.Force(conn, 0, size); err != nil {
		return fmt.Errorf("nftables netlink: %w", err)
	}
	return nil
}
