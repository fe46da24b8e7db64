package nftmeasure

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

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
	if scope != nil {
		// A chain another batch touched is rewritten whatever it holds
		// now: a rule replaced in place keeps the count.
		for _, name := range desired.chains {
			if scope.Chains[name] {
				d.Chains = append(d.Chains, name)
			}
		}
	} else if err := d.checkChains(conn, table, desired); err != nil {
		return d, err
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

// checkChains records in d the wanted chains that are missing or hold
// another number of rules.
func (d *Drift) checkChains(conn *nftables.Conn, table *nftables.Table, desired *Desired) error {
	chains, err := conn.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return fmt.Errorf("listing the chains of table %s: %w", Table, err)
	}
	have := map[string]bool{}
	for _, ch := range chains {
		if ch.Table.Name == Table {
			have[ch.Name] = true
		}
	}
	for _, name := range desired.chains {
		if !have[name] {
			d.Chains = append(d.Chains, name)
			continue
		}
		rules, err := conn.GetRules(table, &nftables.Chain{Name: name, Table: table})
		if err != nil {
			return fmt.Errorf("listing the rules of chain %s: %w", name, err)
		}
		if len(rules) != desired.rules[name] {
			d.Chains = append(d.Chains, name)
		}
	}
	return nil
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
