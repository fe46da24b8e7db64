package nftmeasure

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// Netlink queues c on conn as one netlink batch, for conn.Flush to send: a
// translator from the knftables objects to nf_tables messages for the object
// kinds the partial-sync changes use (regular chains added or flushed,
// `meta l4proto tcp dnat to ADDR:PORT` rules, elements of ServiceIPsMap
// added or deleted). Anything else is refused, and nothing is queued unless
// the whole change translates.
func Netlink(conn *nftables.Conn, c Change) error {
	table := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: Table}
	serviceIPs := &nftables.Set{
		Table:    table,
		Name:     ServiceIPsMap,
		IsMap:    true,
		KeyType:  nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService),
		DataType: nftables.TypeVerdict,
	}
	queue := make([]func() error, 0, len(c))
	for _, op := range c {
		var do func() error
		var err error
		switch obj := op.Object.(type) {
		case *knftables.Chain:
			do, err = chainOp(conn, table, op.Verb, obj)
		case *knftables.Rule:
			do, err = ruleOp(conn, table, op.Verb, obj)
		case *knftables.Element:
			do, err = elementOp(conn, serviceIPs, op.Verb, obj)
		default:
			err = fmt.Errorf("%s %T: not translated to netlink", op.Verb, op.Object)
		}
		if err != nil {
			return err
		}
		queue = append(queue, do)
	}
	for _, do := range queue {
		if err := do(); err != nil {
			return err
		}
	}
	return nil
}

func chainOp(conn *nftables.Conn, table *nftables.Table, verb Verb, obj *knftables.Chain) (func() error, error) {
	if obj.Type != nil || obj.Hook != nil || obj.Priority != nil || obj.Comment != nil {
		return nil, fmt.Errorf("%s chain %s: only regular chains without comments are translated", verb, obj.Name)
	}
	ch := &nftables.Chain{Table: table, Name: obj.Name}
	switch verb {
	case Add:
		return func() error { conn.AddChain(ch); return nil }, nil
	case Flush:
		return func() error { conn.FlushChain(ch); return nil }, nil
	}
	return nil, fmt.Errorf("%s chain %s: verb not translated", verb, obj.Name)
}

func ruleOp(conn *nftables.Conn, table *nftables.Table, verb Verb, obj *knftables.Rule) (func() error, error) {
	const prefix = "meta l4proto tcp dnat to "
	to, ok := strings.CutPrefix(obj.Rule, prefix)
	if verb != Add || !ok || obj.Index != nil || obj.Handle != nil || obj.Comment != nil {
		return nil, fmt.Errorf("%s rule %q in chain %s: only appending %q rules is translated", verb, obj.Rule, obj.Chain, prefix+"ADDR:PORT")
	}
	ap, err := netip.ParseAddrPort(to)
	if err != nil || !ap.Addr().Is4() {
		return nil, fmt.Errorf("rule %q in chain %s: want an IPv4 ADDR:PORT: %v", obj.Rule, obj.Chain, err)
	}
	addr := ap.Addr().As4()
	port := binary.BigEndian.AppendUint16(nil, ap.Port())
	// The expressions nft 1.0.6 emits for this rule (nft --debug=netlink),
	// so that the kernel holds, and nft lists, the same rule either way.
	exprs := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Immediate{Register: 1, Data: addr[:]},
		&expr.Immediate{Register: 2, Data: port},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
	r := &nftables.Rule{Table: table, Chain: &nftables.Chain{Table: table, Name: obj.Chain}, Exprs: exprs}
	return func() error { conn.AddRule(r); return nil }, nil
}

func elementOp(conn *nftables.Conn, serviceIPs *nftables.Set, verb Verb, obj *knftables.Element) (func() error, error) {
	if obj.Map != ServiceIPsMap || len(obj.Key) != 3 || len(obj.Value) != 1 || obj.Comment != nil {
		return nil, fmt.Errorf("%s element %v of %s%s: only elements of map %s are translated", verb, obj.Key, obj.Set, obj.Map, ServiceIPsMap)
	}
	addr, err := netip.ParseAddr(obj.Key[0])
	if err != nil || !addr.Is4() {
		return nil, fmt.Errorf("element %v of %s: want an IPv4 address: %v", obj.Key, obj.Map, err)
	}
	if obj.Key[1] != "tcp" {
		return nil, fmt.Errorf("element %v of %s: only tcp is translated", obj.Key, obj.Map)
	}
	port, err := strconv.ParseUint(obj.Key[2], 10, 16)
	if err != nil {
		return nil, fmt.Errorf("element %v of %s: port: %w", obj.Key, obj.Map, err)
	}
	chain, ok := strings.CutPrefix(obj.Value[0], "goto ")
	if !ok {
		return nil, fmt.Errorf("element %v of %s: value %q: only goto is translated", obj.Key, obj.Map, obj.Value[0])
	}
	// A concatenation's fields each take whole 32-bit registers, so every
	// field is padded to 4 bytes: address, protocol (1 byte), port (2).
	a4 := addr.As4()
	key := append(a4[:], unix.IPPROTO_TCP, 0, 0, 0)
	key = binary.BigEndian.AppendUint16(key, uint16(port))
	key = append(key, 0, 0)
	elem := []nftables.SetElement{{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}}}
	switch verb {
	case Add:
		return func() error { return conn.SetAddElements(serviceIPs, elem) }, nil
	case Delete:
		return func() error { return conn.SetDeleteElements(serviceIPs, elem) }, nil
	}
	return nil, fmt.Errorf("%s element %v of %s: verb not translated", verb, obj.Key, obj.Map)
}
