package nftmeasure

import (
	"encoding/binary"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// Netlink queues c on conn as one netlink batch, for conn.Flush to send: a
// translator from the knftables objects to nf_tables messages for the object
// kinds that the NumgenCascade layout's full load and the partial-sync
// changes use: the table, ServiceIPsMap and its elements (added or
// deleted), the two NAT base chains, regular chains (added or flushed), and
// the rules FullLoad and ReplaceEndpoint write for that layout; and the
// elements of the DataMap layout's maps and sets (DataMapLoad's elements
// and its partial changes), except FirewallAllowSet's intervals.
// Consecutive element operations on one set share a message. Anything else
// (the other layouts' numgen vmaps, EndpointsMap, the DataMap layout's
// rules) is refused, and nothing is queued unless the whole change
// translates.
func Netlink(conn *nftables.Conn, c Change) error {
	table := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: Table}
	serviceIPs := &nftables.Set{
		Table:         table,
		Name:          ServiceIPsMap,
		IsMap:         true,
		Concatenation: true,
		KeyType:       nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService),
		DataType:      nftables.TypeVerdict,
	}
	batch := &elementBatch{conn: conn}
	sets := netlinkSets(table, serviceIPs)
	queue := make([]func() error, 0, len(c))
	for _, op := range c {
		var do func() error
		var err error
		switch obj := op.Object.(type) {
		case *knftables.Table:
			if op.Verb != Add || obj.Comment != nil || len(obj.Flags) > 0 {
				err = fmt.Errorf("%s table: only adding a plain table is translated", op.Verb)
				break
			}
			do = flushFirst(batch, func() error { conn.AddTable(table); return nil })
		case *knftables.Map:
			if op.Verb != Add || obj.Name != ServiceIPsMap || obj.Type != serviceIPsType || obj.TypeOf != "" || len(obj.Flags) > 0 || obj.Comment != nil {
				err = fmt.Errorf("%s map %s: only adding map %s of type %s is translated", op.Verb, obj.Name, ServiceIPsMap, serviceIPsType)
				break
			}
			do = func() error {
				if err := batch.flush(); err != nil {
					return err
				}
				return conn.AddSet(serviceIPs, nil)
			}
		case *knftables.Chain:
			do, err = chainOp(conn, table, op.Verb, obj)
			do = flushFirst(batch, do)
		case *knftables.Rule:
			do, err = ruleOp(conn, table, serviceIPs, op.Verb, obj)
			do = flushFirst(batch, do)
		case *knftables.Element:
			do, err = elementOp(batch, sets, op.Verb, obj)
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
	return batch.flush()
}

// flushFirst makes do send the element operations queued before it first,
// so that the batch keeps the change's order.
func flushFirst(batch *elementBatch, do func() error) func() error {
	if do == nil {
		return nil
	}
	return func() error {
		if err := batch.flush(); err != nil {
			return err
		}
		return do()
	}
}

func chainOp(conn *nftables.Conn, table *nftables.Table, verb Verb, obj *knftables.Chain) (func() error, error) {
	if obj.Comment != nil || obj.Policy != nil || obj.Device != nil {
		return nil, fmt.Errorf("%s chain %s: comments, policies and devices are not translated", verb, obj.Name)
	}
	ch := &nftables.Chain{Table: table, Name: obj.Name}
	if obj.Type != nil || obj.Hook != nil || obj.Priority != nil {
		if verb != Add || obj.Type == nil || *obj.Type != knftables.NATType || obj.Priority == nil || *obj.Priority != knftables.DNATPriority || obj.Hook == nil {
			return nil, fmt.Errorf("%s chain %s: of base chains only adding nat ones at dstnat priority is translated", verb, obj.Name)
		}
		switch *obj.Hook {
		case knftables.PreroutingHook:
			ch.Hooknum = nftables.ChainHookPrerouting
		case knftables.OutputHook:
			ch.Hooknum = nftables.ChainHookOutput
		default:
			return nil, fmt.Errorf("add chain %s: hook %s not translated", obj.Name, *obj.Hook)
		}
		ch.Type, ch.Priority = nftables.ChainTypeNAT, nftables.ChainPriorityNATDest
	}
	switch verb {
	case Add:
		return func() error { conn.AddChain(ch); return nil }, nil
	case Flush:
		return func() error { conn.FlushChain(ch); return nil }, nil
	}
	return nil, fmt.Errorf("%s chain %s: verb not translated", verb, obj.Name)
}

func ruleOp(conn *nftables.Conn, table *nftables.Table, serviceIPs *nftables.Set, verb Verb, obj *knftables.Rule) (func() error, error) {
	if verb != Add || obj.Index != nil || obj.Handle != nil || obj.Comment != nil {
		return nil, fmt.Errorf("%s rule %q in chain %s: only appending rules without comments is translated", verb, obj.Rule, obj.Chain)
	}
	exprs, err := ruleExprs(obj.Rule, serviceIPs)
	if err != nil {
		return nil, fmt.Errorf("rule %q in chain %s: %w", obj.Rule, obj.Chain, err)
	}
	r := &nftables.Rule{Table: table, Chain: &nftables.Chain{Table: table, Name: obj.Chain}, Exprs: exprs}
	return func() error { conn.AddRule(r); return nil }, nil
}

// ruleExprs translates the rules that FullLoad (NumgenCascade) and
// ReplaceEndpoint write into the expressions nft 1.0.6 emits for them (as
// `nft --debug=netlink` shows), so that the kernel holds, and nft lists,
// the same rules either way.
func ruleExprs(rule string, serviceIPs *nftables.Set) ([]expr.Any, error) {
	if rule == "ip daddr . meta l4proto . th dport vmap @"+ServiceIPsMap {
		// A concatenation takes whole 32-bit registers (8, 9, 10 are the
		// 32-bit names of 128-bit register 1's words).
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 9},
			&expr.Payload{DestRegister: 10, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 1, SetName: serviceIPs.Name, SetID: serviceIPs.ID, IsDestRegSet: true, DestRegister: 0},
		}, nil
	}
	if chain, ok := strings.CutPrefix(rule, "jump "); ok && !strings.Contains(chain, " ") {
		return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}, nil
	}
	if chain, ok := strings.CutPrefix(rule, "goto "); ok && !strings.Contains(chain, " ") {
		return []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}}, nil
	}
	if rest, ok := strings.CutPrefix(rule, "numgen random mod "); ok {
		mod, chain, ok := strings.Cut(rest, " 0 goto ")
		k, err := strconv.ParseUint(mod, 10, 32)
		if !ok || err != nil || k < 2 || strings.Contains(chain, " ") {
			return nil, fmt.Errorf("want numgen random mod K 0 goto CHAIN")
		}
		return []expr.Any{
			&expr.Numgen{Register: 1, Modulus: uint32(k), Type: unix.NFT_NG_RANDOM},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 0, 0, 0}},
			&expr.Verdict{Kind: expr.VerdictGoto, Chain: chain},
		}, nil
	}
	const prefix = "meta l4proto tcp dnat to "
	to, ok := strings.CutPrefix(rule, prefix)
	if !ok {
		return nil, fmt.Errorf("not translated to netlink")
	}
	ap, err := netip.ParseAddrPort(to)
	if err != nil || !ap.Addr().Is4() {
		return nil, fmt.Errorf("want an IPv4 ADDR:PORT: %v", err)
	}
	addr := ap.Addr().As4()
	port := binary.BigEndian.AppendUint16(nil, ap.Port())
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Immediate{Register: 1, Data: addr[:]},
		&expr.Immediate{Register: 2, Data: port},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}, nil
}

// elementsPerMessage bounds the elements of one NEWSETELEM or DELSETELEM
// message: their list is one netlink attribute, whose length is 16 bits.
const elementsPerMessage = 512

// elementBatch gathers consecutive element operations on one set into one
// message, as nft does, rather than one message (and acknowledgement) per
// element.
type elementBatch struct {
	conn  *nftables.Conn
	set   *nftables.Set
	verb  Verb
	elems []nftables.SetElement
}

func (b *elementBatch) flush() error {
	if len(b.elems) == 0 {
		return nil
	}
	var err error
	if b.verb == Add {
		err = b.conn.SetAddElements(b.set, b.elems)
	} else {
		err = b.conn.SetDeleteElements(b.set, b.elems)
	}
	b.elems = nil
	return err
}

func (b *elementBatch) add(set *nftables.Set, verb Verb, e nftables.SetElement) error {
	if b.set != set || b.verb != verb || len(b.elems) == elementsPerMessage {
		if err := b.flush(); err != nil {
			return err
		}
		b.set, b.verb = set, verb
	}
	b.elems = append(b.elems, e)
	return nil
}

// netlinkSets are the sets and maps whose elements the translator encodes,
// by name: those of every layout's ServiceIPsMap and of the DataMap
// layout, except FirewallAllowSet (an interval set).
func netlinkSets(table *nftables.Table, serviceIPs *nftables.Set) map[string]*nftables.Set {
	sets := map[string]*nftables.Set{ServiceIPsMap: serviceIPs}
	for _, name := range []string{EndpointsDataMap, HairpinSet, NoEndpointRejectSet, NoEndpointDropSet, FirewallIPsSet} {
		sets[name] = &nftables.Set{Table: table, Name: name, IsMap: name == EndpointsDataMap}
	}
	return sets
}

func elementOp(batch *elementBatch, sets map[string]*nftables.Set, verb Verb, obj *knftables.Element) (func() error, error) {
	name := obj.Set + obj.Map
	set, ok := sets[name]
	if !ok || obj.Comment != nil || (obj.Set != "") == set.IsMap {
		return nil, fmt.Errorf("%s element %v of %s: only elements of %v are translated", verb, obj.Key, name, slices.Sorted(maps.Keys(sets)))
	}
	if verb != Add && verb != Delete {
		return nil, fmt.Errorf("%s element %v of %s: verb not translated", verb, obj.Key, name)
	}
	e, err := encodeElement(name, obj)
	if err != nil {
		return nil, fmt.Errorf("%s element %v of %s: %w", verb, obj.Key, name, err)
	}
	return func() error { return batch.add(set, verb, e) }, nil
}

// encodeElement encodes obj's key and value as nft does: every field of a
// concatenation takes whole 32-bit registers, so it is padded to a multiple
// of 4 bytes; numgen's result is a host-order 32-bit integer.
func encodeElement(set string, obj *knftables.Element) (nftables.SetElement, error) {
	var e nftables.SetElement
	service := func(fields []string) ([]byte, error) {
		if len(fields) < 3 {
			return nil, fmt.Errorf("want address . protocol . port")
		}
		addr, err := ipv4(fields[0])
		if err != nil {
			return nil, err
		}
		if fields[1] != "tcp" {
			return nil, fmt.Errorf("only tcp is translated")
		}
		port, err := strconv.ParseUint(fields[2], 10, 16)
		if err != nil {
			return nil, fmt.Errorf("port: %w", err)
		}
		b := append(addr, unix.IPPROTO_TCP, 0, 0, 0)
		return append(binary.BigEndian.AppendUint16(b, uint16(port)), 0, 0), nil
	}
	switch set {
	case ServiceIPsMap:
		if len(obj.Key) != 3 || len(obj.Value) != 1 {
			return e, fmt.Errorf("want a 3-field key and a verdict")
		}
		chain, ok := strings.CutPrefix(obj.Value[0], "goto ")
		if !ok || strings.Contains(chain, " ") {
			return e, fmt.Errorf("value %q: only goto is translated", obj.Value[0])
		}
		e.VerdictData = &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}
	case EndpointsDataMap:
		if len(obj.Key) != 4 || len(obj.Value) != 2 {
			return e, fmt.Errorf("want a 4-field key and an address . port value")
		}
		index, err := strconv.ParseUint(obj.Key[3], 10, 32)
		if err != nil {
			return e, fmt.Errorf("endpoint index: %w", err)
		}
		addr, err := ipv4(obj.Value[0])
		if err != nil {
			return e, err
		}
		port, err := strconv.ParseUint(obj.Value[1], 10, 16)
		if err != nil {
			return e, fmt.Errorf("endpoint port: %w", err)
		}
		e.Val = append(binary.BigEndian.AppendUint16(addr, uint16(port)), 0, 0)
		key, err := service(obj.Key[:3])
		if err != nil {
			return e, err
		}
		e.Key = binary.NativeEndian.AppendUint32(key, uint32(index))
		return e, nil
	case HairpinSet:
		if len(obj.Key) != 2 || len(obj.Value) != 0 {
			return e, fmt.Errorf("want address . address")
		}
		a, err := ipv4(obj.Key[0])
		if err != nil {
			return e, err
		}
		b, err := ipv4(obj.Key[1])
		if err != nil {
			return e, err
		}
		e.Key = append(a, b...)
		return e, nil
	default:
		if len(obj.Key) != 3 || len(obj.Value) != 0 {
			return e, fmt.Errorf("want a 3-field key and no value")
		}
	}
	key, err := service(obj.Key)
	e.Key = key
	return e, err
}

func ipv4(s string) ([]byte, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return nil, fmt.Errorf("%q: want an IPv4 address", s)
	}
	b := a.As4()
	return b[:], nil
}
