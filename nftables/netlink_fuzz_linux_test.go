package nftables

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mdlayher/netlink"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"
)

// FuzzEncodeElement gives the netlink translator elements with arbitrary
// fields ("|" separates them in the fuzzed key and value) for every set it
// knows and a few it must refuse, and checks that it never panics, that a
// deletion's key is the addition's, and that whatever it encodes has the
// set's layout: each field its width, read back by the watcher's
// decodeFields to parts that encode to the same bytes, and a verdict map's
// value one chain name.
func FuzzEncodeElement(f *testing.F) {
	names := slices.Sorted(maps.Keys(netlinkSets))
	names = append(names, noEndpointServicesMap, firewallAllowSet, "")
	for _, s := range []struct {
		set         uint8
		isMap, v6   bool
		key, value  string
		withComment bool
	}{
		{0, true, false, "10.96.0.1|udp|53|7", "10.0.0.5|5353", false},
		{1, true, true, "sctp|30080|7", "fd00::5|80", false},
		{2, true, false, "10.96.0.1|tcp|80", "goto lb-3", false},
		{2, true, false, "10.96.0.1|tcp|80", "goto lb 3", false},
		{3, false, true, "fd00::1|fd00::1", "", false},
		{4, false, false, "::ffff:10.0.0.1", "", false},
		{5, false, false, "10.96.0.1|icmp|0", "", true},
		{6, true, false, "tcp|65536", "goto x", false},
	} {
		f.Add(s.set, s.isMap, s.v6, s.key, s.value, s.withComment)
	}
	f.Fuzz(func(t *testing.T, set uint8, isMap, v6 bool, key, value string, withComment bool) {
		el := &knftables.Element{Family: knftables.IPv4Family, Table: "t", Key: strings.Split(key, "|")}
		if v6 {
			el.Family = knftables.IPv6Family
		}
		name := names[int(set)%len(names)]
		if isMap {
			el.Map = name
		} else {
			el.Set = name
		}
		if value != "" {
			el.Value = strings.Split(value, "|")
		}
		if withComment {
			el.Comment = ptr.To("c")
		}
		enc, err := encodeElement(el)
		keyOnly, keyErr := encodeKey(el)
		// What is sent is the wire encoding: it must refuse what
		// encodeElement refuses, and carry the bytes it checked.
		wire, wireErr := appendElementAttr(nil, 1, el, false)
		if (wireErr == nil) != (err == nil) {
			t.Fatalf("%+v: encodeElement's error %v, the wire encoding's %v", el, err, wireErr)
		}
		if err != nil {
			return
		}
		if diff := cmp.Diff(enc, decodeElementAttr(t, wire), cmp.AllowUnexported(encodedElement{})); diff != "" {
			t.Errorf("%+v: the wire encoding carries other bytes (-encodeElement +wire):\n%s", el, diff)
		}
		if keyErr != nil {
			t.Fatalf("%+v: the addition encodes, the deletion's key fails: %v", el, keyErr)
		}
		if diff := cmp.Diff(enc.key, keyOnly); diff != "" {
			t.Errorf("%+v: the deletion's key is not the addition's (-addition +deletion):\n%s", el, diff)
		}
		if !netlinkElement(el) {
			t.Errorf("%+v encodes, but netlinkElement does not take it", el)
		}
		spec := netlinkSets[name]
		checkLayout(t, "key", spec.key, enc.key, v6)
		if spec.value != nil {
			checkLayout(t, "value", spec.value, enc.value, v6)
		}
		if spec.verdict && (enc.chain == "" || strings.ContainsAny(enc.chain, " \t")) {
			t.Errorf("%+v: verdict chain %q", el, enc.chain)
		}
	})
}

// checkLayout checks that b is fields as encodeFields writes them: it
// decodes, and its decoding encodes to b again.
func checkLayout(t *testing.T, what string, fields []field, b []byte, v6 bool) {
	t.Helper()
	s, ok := decodeFields(fields, b, v6)
	if !ok {
		t.Fatalf("%s %x does not decode", what, b)
	}
	again, err := encodeFields(fields, strings.Split(s, " . "), v6)
	if err != nil {
		t.Fatalf("%s %x decodes to %q, which does not encode: %v", what, b, s, err)
	}
	if diff := cmp.Diff(b, again); diff != "" {
		t.Errorf("%s %x decodes to %q, which encodes otherwise (-first +again):\n%s", what, b, s, diff)
	}
}

// decodeElementAttr reads back one list item of appendElementAttr: its key,
// and its value or verdict chain.
func decodeElementAttr(t *testing.T, b []byte) encodedElement {
	t.Helper()
	var e encodedElement
	item, err := netlink.NewAttributeDecoder(b)
	if err != nil || !item.Next() {
		t.Fatalf("item %x does not decode: %v", b, err)
	}
	ad, err := netlink.NewAttributeDecoder(item.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	inner := func(b []byte, typ uint16) []byte {
		d, err := netlink.NewAttributeDecoder(b)
		if err != nil || !d.Next() || d.Type() != typ {
			t.Fatalf("attribute %x: want one of type %d", b, typ)
		}
		return d.Bytes()
	}
	for ad.Next() {
		switch ad.Type() {
		case attrElemKey:
			e.key = inner(ad.Bytes(), attrDataValue)
		case attrElemData:
			d, err := netlink.NewAttributeDecoder(ad.Bytes())
			if err != nil || !d.Next() {
				t.Fatalf("data %x does not decode", ad.Bytes())
			}
			switch d.Type() {
			case attrDataValue:
				e.value = d.Bytes()
			case attrDataVerdict:
				v, err := netlink.NewAttributeDecoder(d.Bytes())
				if err != nil {
					t.Fatal(err)
				}
				for v.Next() {
					if v.Type() == attrVerdictChain {
						e.chain = v.String()
					}
				}
			}
		default:
			t.Errorf("item has attribute %d", ad.Type())
		}
	}
	return e
}
