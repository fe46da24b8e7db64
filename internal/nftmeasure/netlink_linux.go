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
// kinds that the NumgenCascade layout's full load and the partial-sync
// changes use: the table, ServiceIPsMap and its elements (added or
// deleted), the two NAT base chains, regular chains (added or flushed), and
// the rules FullLoad and ReplaceEndpoint write for that layout. Anything
// else (the other layouts' numgen vmaps, EndpointsMap) is refused, and
// nothing is queued unless the whole change translates.
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
			do = func() error { conn.AddTable(table); return nil }
		case *knftables.Map:
			if op.Verb != Add || obj.Name != ServiceIPsMap || obj.Type != serviceIPsType || obj.TypeOf != "" || len(obj.Flags) > 0 || obj.Comment != nil {
				err = fmt.Errorf("%s map %s: only adding map %s of type %s is translated", op.Verb, obj.Name, ServiceIPsMap, serviceIPsType)
				break
			}
			do = func() error { return conn.AddSet(serviceIPs, nil) }
		case *knftables.Chain:
			do, err = chainOp(conn, table, op.Verb, obj)
		case *knftables.Rule:
			do, err = ruleOp(conn, table, serviceIPs, op.Verb, obj)
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

// serviceIPsType is the type of ServiceIPsMap, as FullLoad declares it.
const serviceIPsType = "ipv4_addr . inet_proto . inet_service : verdict"

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
