package nftmeasure

import (
	"encoding/binary"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	proxynft "github.com/proxykit/proxykit/nftables"
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
// it from a whole table costs time in proportion to its elements.
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
			// what earlier ones sent), so the big map is checked by looking its wanted
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

// checkKeys looks the keys of EndpointsDataMap up in the kernel with the
// nftables block's KernelState.CheckElements (its keyed lookup grew from
// this package's), and records in d those that differ from want: missing,
// another value, or present and not wanted.
func (d *Drift) checkKeys(netnsFD int, set *nftables.Set, want map[string]wanted, keys map[string]bool) error {
	sorted := slices.Sorted(maps.Keys(keys))
	elems := make([]*knftables.Element, len(sorted))
	for i, k := range sorted {
		if w, ok := want[k]; ok {
			e := *w.op
			e.Family, e.Table = Family, Table
			elems[i] = &e
			continue
		}
		e, err := endpointKeyElement(k)
		if err != nil {
			return fmt.Errorf("key %x of %s: %w", k, set.Name, err)
		}
		elems[i] = e
	}
	states, err := proxynft.NewKernelState(fmt.Sprintf("/proc/self/fd/%d", netnsFD)).CheckElements(elems)
	if err != nil {
		return fmt.Errorf("looking up elements of %s: %w", set.Name, err)
	}
	for i, k := range sorted {
		w, wanted := want[k]
		switch {
		case !wanted && states[i] != proxynft.ElementMissing:
			d.extra[set] = append(d.extra[set], nftables.SetElement{Key: []byte(k)})
		case !wanted:
		case states[i] == proxynft.ElementMissing:
			d.Elements = append(d.Elements, Op{Add, w.op})
		case states[i] == proxynft.ElementDiffers:
			d.Elements = append(d.Elements, Op{Delete, w.op}, Op{Add, w.op})
		}
	}
	return nil
}

// endpointKeyElement is the element of EndpointsDataMap of key as the kernel
// encodes it (address, protocol, port and index, each in a 32-bit
// register), with a made-up value: CheckElements then tells only whether
// the kernel holds the key.
func endpointKeyElement(key string) (*knftables.Element, error) {
	b := []byte(key)
	if len(b) != 16 {
		return nil, fmt.Errorf("%d bytes, want 16", len(b))
	}
	proto, ok := map[byte]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp", unix.IPPROTO_SCTP: "sctp"}[b[4]]
	if !ok {
		return nil, fmt.Errorf("protocol %d", b[4])
	}
	return &knftables.Element{
		Family: Family, Table: Table, Map: EndpointsDataMap,
		Key: []string{
			netip.AddrFrom4([4]byte(b[:4])).String(), proto,
			strconv.Itoa(int(binary.BigEndian.Uint16(b[8:10]))),
			strconv.FormatUint(uint64(binary.NativeEndian.Uint32(b[12:16])), 10),
		},
		Value: []string{"0.0.0.0", "1"},
	}, nil
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
