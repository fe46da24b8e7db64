package nftables

import (
	"encoding/binary"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"
)

// TestEncodeElement checks the netlink encoding of the elements a split
// load sends, field by field, and that anything else is refused rather
// than sent wrong.
func TestEncodeElement(t *testing.T) {
	v4 := func(el knftables.Element) *knftables.Element {
		el.Family, el.Table = knftables.IPv4Family, "t"
		return &el
	}
	v6 := func(el knftables.Element) *knftables.Element {
		el.Family, el.Table = knftables.IPv6Family, "t"
		return &el
	}
	index7 := binary.NativeEndian.AppendUint32(nil, 7)
	for _, tc := range []struct {
		name string
		el   *knftables.Element
		want encodedElement // zero: an error
	}{
		{"endpoint", v4(knftables.Element{Map: endpointsMap, Key: []string{"10.96.0.1", "udp", "53", "7"}, Value: []string{"10.0.0.5", "5353"}}),
			encodedElement{key: append([]byte{10, 96, 0, 1, 17, 0, 0, 0, 0, 53, 0, 0}, index7...), value: []byte{10, 0, 0, 5, 0x14, 0xe9, 0, 0}}},
		{"node-port endpoint, IPv6", v6(knftables.Element{Map: nodePortEndpointsMap, Key: []string{"sctp", "30080", "7"}, Value: []string{"fd00::5", "80"}}),
			encodedElement{key: append([]byte{132, 0, 0, 0, 0x75, 0x80, 0, 0}, index7...), value: []byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 80, 0, 0}}},
		{"service verdict", v4(knftables.Element{Map: serviceIPsMap, Key: []string{"10.96.0.1", "tcp", "80"}, Value: []string{"goto lb-3"}}),
			encodedElement{key: []byte{10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0}, chain: "lb-3"}},
		{"hairpin", v4(knftables.Element{Set: hairpinSet, Key: []string{"10.0.0.5", "10.0.0.5"}}),
			encodedElement{key: []byte{10, 0, 0, 5, 10, 0, 0, 5}}},
		{"comment stays with nft", v4(knftables.Element{Map: serviceIPsMap, Key: []string{"10.96.0.1", "tcp", "80"}, Value: []string{"goto lb-3"}, Comment: ptr.To("x")}), encodedElement{}},
		{"not a goto", v4(knftables.Element{Map: serviceIPsMap, Key: []string{"10.96.0.1", "tcp", "80"}, Value: []string{"drop"}}), encodedElement{}},
		{"NUL in the chain", v4(knftables.Element{Map: serviceIPsMap, Key: []string{"10.96.0.1", "tcp", "80"}, Value: []string{"goto a\x00b"}}), encodedElement{}},
		{"other family's address", v4(knftables.Element{Set: clusterIPsSet, Key: []string{"fd00::1"}}), encodedElement{}},
		{"mapped address", v6(knftables.Element{Set: clusterIPsSet, Key: []string{"::ffff:10.0.0.1"}}), encodedElement{}},
		{"unknown protocol", v4(knftables.Element{Set: firewallIPsSet, Key: []string{"10.96.0.1", "icmp", "80"}}), encodedElement{}},
		{"port 0", v4(knftables.Element{Set: firewallIPsSet, Key: []string{"10.96.0.1", "tcp", "0"}}), encodedElement{}},
		{"short key", v4(knftables.Element{Set: firewallIPsSet, Key: []string{"10.96.0.1", "tcp"}}), encodedElement{}},
		{"interval set", v4(knftables.Element{Set: firewallAllowSet, Key: []string{"10.96.0.1", "tcp", "80", "10.0.0.0/8"}}), encodedElement{}},
		{"set element given to a map", v4(knftables.Element{Map: clusterIPsSet, Key: []string{"10.96.0.1"}, Value: []string{"x"}}), encodedElement{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := encodeElement(tc.el)
			if tc.want.key == nil {
				if err == nil {
					t.Fatalf("encoded %+v, want an error", got)
				}
				if netlinkElement(tc.el) && tc.el.Comment != nil {
					t.Error("netlinkElement takes an element with a comment")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !netlinkElement(tc.el) {
				t.Error("netlinkElement does not take it")
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(encodedElement{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestEncodeKey checks the key of a deletion: the same bytes as the
// addition's key, the value not read (a deletion is found by its key), and
// the element still refused where the addition is for its set or key.
func TestEncodeKey(t *testing.T) {
	el := func(e knftables.Element) *knftables.Element {
		e.Family, e.Table = knftables.IPv4Family, "t"
		return &e
	}
	for _, tc := range []struct {
		name string
		el   *knftables.Element
		want []byte // nil: an error
	}{
		{"endpoint", el(knftables.Element{Map: endpointsMap, Key: []string{"10.96.0.1", "tcp", "80", "0"}, Value: []string{"10.0.0.5", "8080"}}),
			append([]byte{10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0}, binary.NativeEndian.AppendUint32(nil, 0)...)},
		{"value not read", el(knftables.Element{Map: serviceIPsMap, Key: []string{"10.96.0.1", "tcp", "80"}, Value: []string{"drop"}}),
			[]byte{10, 96, 0, 1, 6, 0, 0, 0, 0, 80, 0, 0}},
		{"cluster IP", el(knftables.Element{Set: clusterIPsSet, Key: []string{"10.96.0.1"}}), []byte{10, 96, 0, 1}},
		{"comment stays with nft", el(knftables.Element{Map: serviceIPsMap, Key: []string{"10.96.0.1", "tcp", "80"}, Comment: ptr.To("x")}), nil},
		{"interval set", el(knftables.Element{Set: firewallAllowSet, Key: []string{"10.96.0.1", "tcp", "80", "10.0.0.0/8"}}), nil},
		{"bad key", el(knftables.Element{Set: clusterIPsSet, Key: []string{"10.96.0.1/32"}}), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := encodeKey(tc.el)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("encoded %v, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
