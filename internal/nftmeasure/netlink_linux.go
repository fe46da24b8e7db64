package nftmeasure

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
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

// wanted is an element DataMapLoad wants: its value as the kernel encodes
// it, and the element itself.
type wanted struct {
	value string
	op    *knftables.Element
}

// Drift is what differs between a DataMap table in the kernel and the
// table DataMapLoad describes.
type Drift struct {
	// Chains are the chains that are missing or hold another number of
	// rules than wanted: a writer rewrites them (flush and add).
	Chains []string
	// Elements adds the wanted elements that are missing or map to
	// another value (deleting the wrong value first).
	Elements Change
	// extra are the elements the kernel holds and nothing wants, by set.
	extra map[*nftables.Set][]nftables.SetElement
}

// Empty reports whether d found nothing to repair.
func (d Drift) Empty() bool { return len(d.Chains) == 0 && len(d.Elements) == 0 && len(d.extra) == 0 }

// Extra is the number of unwanted elements found.
func (d Drift) Extra() int {
	n := 0
	for _, e := range d.extra {
		n += len(e)
	}
	return n
}

// Desired is the DataMap table a writer wants, indexed as DetectDrift
// compares it: rule counts by chain, and elements by set and by key as the
// kernel encodes them. A writer keeps it up to date as it syncs; building
// it from a whole table costs about 10 µs per element.
type Desired struct {
	chains []string
	rules  map[string]int
	elems  map[string]map[string]wanted
}

// NewDesired indexes DataMapLoad's two parts. It fails on an element that
// the netlink translator does not encode, or on anything but added
// elements in elements.
func NewDesired(skeleton, elements Change) (*Desired, error) {
	want := &Desired{rules: map[string]int{}, elems: map[string]map[string]wanted{}}
	for _, op := range skeleton {
		switch o := op.Object.(type) {
		case *knftables.Chain:
			want.rules[o.Name] = 0
			want.chains = append(want.chains, o.Name)
		case *knftables.Rule:
			want.rules[o.Chain]++
		}
	}
	for _, op := range elements {
		e, ok := op.Object.(*knftables.Element)
		if !ok || op.Verb != Add {
			return nil, fmt.Errorf("%s %T: want only added elements", op.Verb, op.Object)
		}
		name := e.Set + e.Map
		if name == FirewallAllowSet {
			continue
		}
		enc, err := encodeElement(name, e)
		if err != nil {
			return nil, fmt.Errorf("element %v of %s: %w", e.Key, name, err)
		}
		if want.elems[name] == nil {
			want.elems[name] = map[string]wanted{}
		}
		want.elems[name][string(enc.Key)] = wanted{elementValue(enc), e}
	}
	return want, nil
}

// DetectDrift reads the DataMap table over conn without listing it as nft
// does: the names of its chains, the rules of the wanted chains only
// (counted, not compared: a rule edited in place goes unseen), the small
// sets and maps whole, and EndpointsDataMap by looking each wanted key up,
// and compares them with want byte for byte. FirewallAllowSet's intervals
// are not compared. It fails if the table or one of its sets cannot be
// read.
func DetectDrift(conn *nftables.Conn, want *Desired) (Drift, error) {
	return DetectDriftIn(conn, want, nil)
}

// Scope narrows DetectDriftIn to what a Watcher saw others change.
type Scope struct {
	// Chains are the chains to check.
	Chains map[string]bool
	// EndpointKeys are the keys of EndpointsDataMap to check, as the
	// kernel encodes them.
	EndpointKeys map[string]bool
	// SmallSets asks for every set and map but EndpointsDataMap to be
	// read and compared whole.
	SmallSets bool
}

// DetectDriftIn is DetectDrift limited to scope; a nil scope is the whole
// table. Every wanted chain in scope is returned for rewriting, unread. An
// element of EndpointsDataMap in scope that nothing wants is found, and
// deleted by RepairElements.
func DetectDriftIn(conn *nftables.Conn, desired *Desired, scope *Scope) (Drift, error) {
	table := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: Table}
	d := Drift{extra: map[*nftables.Set][]nftables.SetElement{}}
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return d, fmt.Errorf("listing the chains of table %s: %w", Table, err)
	}
	have := map[string]bool{}
	for _, ch := range chains {
		if ch.Table.Name == Table {
			have[ch.Name] = true
		}
	}
	for _, name := range desired.chains {
		if scope != nil && !scope.Chains[name] {
			continue
		}
		if scope != nil || !have[name] {
			// A chain another batch touched is rewritten whatever it
			// holds now: a rule replaced in place keeps the count.
			d.Chains = append(d.Chains, name)
			continue
		}
		rules, err := conn.GetRules(table, &nftables.Chain{Name: name, Table: table})
		if err != nil {
			return d, fmt.Errorf("listing the rules of chain %s: %w", name, err)
		}
		if len(rules) != desired.rules[name] {
			d.Chains = append(d.Chains, name)
		}
	}

	sets := netlinkSets(table, &nftables.Set{Table: table, Name: ServiceIPsMap, IsMap: true})
	want := desired.elems
	for _, name := range slices.Sorted(maps.Keys(sets)) {
		set := sets[name]
		if scope != nil && name == EndpointsDataMap {
			if err := d.checkKeys(conn.NetNS, set, want[name], scope.EndpointKeys); err != nil {
				return d, err
			}
			continue
		}
		if scope != nil && !scope.SmallSets {
			continue
		}
		if name == EndpointsDataMap {
			// A dump of a set costs the kernel quadratic time (every
			// message of the dump walks the set from its start to skip
			// what earlier ones sent: 41 s for this map at 30,000
			// services), so the big map is checked by looking its wanted
			// keys up instead. An element nothing wants is not found
			// this way, but none can be reached either: the shared
			// chains look up only the indexes below a service's endpoint
			// count, of services that ServiceIPsMap holds, and a wrong
			// value under a wanted key is found.
			all := make(map[string]bool, len(want[name]))
			for k := range want[name] {
				all[k] = true
			}
			if err := d.checkKeys(conn.NetNS, set, want[name], all); err != nil {
				return d, err
			}
			continue
		}
		got, err := conn.GetSetElements(set)
		if err != nil {
			return d, fmt.Errorf("listing the elements of %s: %w", name, err)
		}
		seen := make(map[string]bool, len(got))
		for _, e := range got {
			if name == ServiceIPsMap && e.VerdictData == nil {
				// The library leaves a verdict undecoded unless the set
				// was read with its type: it is NFTA_DATA_VERDICT's
				// attributes.
				v, err := decodeVerdict(e.Val)
				if err != nil {
					return d, fmt.Errorf("element %x of %s: %w", e.Key, name, err)
				}
				e.VerdictData = v
			}
			k := string(e.Key)
			w, ok := want[name][k]
			switch {
			case !ok:
				d.extra[set] = append(d.extra[set], nftables.SetElement{Key: e.Key})
			case w.value != elementValue(e):
				d.Elements = append(d.Elements, Op{Delete, w.op}, Op{Add, w.op})
			}
			seen[k] = true
		}
		for _, k := range slices.Sorted(maps.Keys(want[name])) {
			if !seen[k] {
				d.Elements = append(d.Elements, Op{Add, want[name][k].op})
			}
		}
	}
	return d, nil
}

// checkKeys looks the keys up in set and records in d those that differ
// from want: missing, another value, or present and not wanted.
func (d *Drift) checkKeys(netnsFD int, set *nftables.Set, want map[string]wanted, keys map[string]bool) error {
	sorted := slices.Sorted(maps.Keys(keys))
	elems := make([]nftables.SetElement, len(sorted))
	for i, k := range sorted {
		elems[i] = nftables.SetElement{Key: []byte(k)}
	}
	got, err := lookupElements(netnsFD, set, elems)
	if err != nil {
		return fmt.Errorf("looking up elements of %s: %w", set.Name, err)
	}
	for i, k := range sorted {
		w, wanted := want[k]
		switch {
		case !wanted && got[i] != nil:
			d.extra[set] = append(d.extra[set], elems[i])
		case !wanted:
		case got[i] == nil:
			d.Elements = append(d.Elements, Op{Add, w.op})
		case string(got[i]) != w.value:
			d.Elements = append(d.Elements, Op{Delete, w.op}, Op{Add, w.op})
		}
	}
	return nil
}

func elementValue(e nftables.SetElement) string {
	if e.VerdictData != nil {
		return fmt.Sprintf("%d %s", e.VerdictData.Kind, e.VerdictData.Chain)
	}
	return string(e.Val)
}

// RepairElements queues on conn, as one batch for conn.Flush, the element
// operations that undo d's element drift: the unwanted elements deleted,
// the missing or wrong ones added. Chains are the writer's to rewrite.
func RepairElements(conn *nftables.Conn, d Drift) error {
	for set, elems := range d.extra {
		for chunk := range slices.Chunk(elems, elementsPerMessage) {
			if err := conn.SetDeleteElements(set, chunk); err != nil {
				return err
			}
		}
	}
	return Netlink(conn, d.Elements)
}

func decodeVerdict(b []byte) (*expr.Verdict, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, err
	}
	ad.ByteOrder = binary.BigEndian
	v := &expr.Verdict{}
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			v.Kind = expr.VerdictKind(int32(ad.Uint32()))
		case unix.NFTA_VERDICT_CHAIN:
			v.Chain = ad.String()
		}
	}
	return v, ad.Err()
}

// Generation returns the nf_tables generation of the network namespace
// that netnsFD names (0: the caller's): a counter the kernel bumps on every
// committed batch, of any table. A writer that records it right after its
// own commit, and finds it unchanged at the next resync, knows that nothing
// in the namespace's nftables ruleset changed since, without reading its
// table; any other value, a commit by anyone, calls for DetectDrift. It
// fails if the namespace cannot be reached.
func Generation(netnsFD int) (uint32, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netnsFD})
	if err != nil {
		return 0, fmt.Errorf("dialing nf_tables: %w", err)
	}
	defer conn.Close()
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN),
			Flags: netlink.Request,
		},
		// struct nfgenmsg: family, version, resource id.
		Data: []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, fmt.Errorf("reading the nf_tables generation: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, err
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return ad.Uint32(), nil
			}
		}
		if err := ad.Err(); err != nil {
			return 0, err
		}
	}
	return 0, fmt.Errorf("reading the nf_tables generation: no NFTA_GEN_ID in the reply")
}

// lookupBatch is how many keys one GETSETELEM request asks for.
const lookupBatch = 256

// lookupElements asks the kernel for the data of each of elems' keys in
// set (a data map) of the namespace netnsFD, lookupBatch keys per request,
// and returns it by index: nil for a key the set does not hold. The kernel
// answers a request element by element and stops at the first key it does
// not find, so a request that fails is asked again key by key.
func lookupElements(netnsFD int, set *nftables.Set, elems []nftables.SetElement) ([][]byte, error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: netnsFD})
	if err != nil {
		return nil, fmt.Errorf("dialing nf_tables: %w", err)
	}
	defer conn.Close()
	// The kernel answers every key with its own message, queued at once:
	// a batch's answers (about 2 KB each in the receive buffer's
	// accounting) must fit, past the rmem_max cap (root only).
	if err := forceReadBuffer(conn, 4<<20); err != nil {
		return nil, err
	}
	out := make([][]byte, len(elems))
	for start := 0; start < len(elems); start += lookupBatch {
		chunk := elems[start:min(start+lookupBatch, len(elems))]
		vals, err := getElements(conn, set, chunk)
		if errors.Is(err, unix.ENOENT) {
			for i := range chunk {
				v, err := getElements(conn, set, chunk[i:i+1])
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

func getElements(conn *netlink.Conn, set *nftables.Set, elems []nftables.SetElement) ([][]byte, error) {
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, set.Table.Name)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, set.Name)
	ae.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(list *netlink.AttributeEncoder) error {
		for _, e := range elems {
			list.Nested(unix.NFTA_LIST_ELEM, func(elem *netlink.AttributeEncoder) error {
				elem.Nested(unix.NFTA_SET_ELEM_KEY, func(key *netlink.AttributeEncoder) error {
					key.Bytes(unix.NFTA_DATA_VALUE, e.Key)
					return nil
				})
				return nil
			})
		}
		return nil
	})
	data, err := ae.Encode()
	if err != nil {
		return nil, err
	}
	req := netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSETELEM),
			Flags: netlink.Request | netlink.Acknowledge,
		},
		Data: append([]byte{byte(set.Table.Family), unix.NFNETLINK_V0, 0, 0}, data...),
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
				if len(vals) != len(elems) {
					return nil, fmt.Errorf("%d answers to %d keys", len(vals), len(elems))
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
// message.
func elementData(b []byte) ([]byte, error) {
	if len(b) < 4 {
		return nil, fmt.Errorf("short set element message")
	}
	var data []byte
	ad, err := netlink.NewAttributeDecoder(b[4:])
	if err != nil {
		return nil, err
	}
	for ad.Next() {
		if ad.Type() != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			continue
		}
		ad.Nested(func(list *netlink.AttributeDecoder) error {
			for list.Next() {
				list.Nested(func(elem *netlink.AttributeDecoder) error {
					for elem.Next() {
						if elem.Type() == unix.NFTA_SET_ELEM_DATA {
							elem.Nested(func(v *netlink.AttributeDecoder) error {
								for v.Next() {
									if v.Type() == unix.NFTA_DATA_VALUE {
										data = v.Bytes()
									}
								}
								return nil
							})
						}
					}
					return nil
				})
			}
			return nil
		})
	}
	if err := ad.Err(); err != nil {
		return nil, err
	}
	if data == nil {
		return nil, fmt.Errorf("set element without data")
	}
	return data, nil
}

func forceReadBuffer(conn *netlink.Conn, size int) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var sockErr error
	if err := raw.Control(func(fd uintptr) {
		sockErr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size)
	}); err != nil {
		return err
	}
	if sockErr != nil {
		return fmt.Errorf("setting the receive buffer: %w", sockErr)
	}
	return nil
}
