package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"
)

// googleBatch is b as google/nftables encodes it (SetDeleteElements and
// SetAddElements of the elements encodeElement gives, grouped by set as
// encodeBatch groups them, elementsPerMessage to a message), the messages
// of its batch as it would send them: the encoding ApplyElementBatch used
// before it wrote its own, against which the kernel tests passed.
func googleBatch(t *testing.T, b ElementBatch) []netlink.Message {
	t.Helper()
	var sent []netlink.Message
	conn, err := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		sent = append(sent, req...)
		return nil, errors.New("not sent")
	}))
	if err != nil {
		t.Fatal(err)
	}
	for _, part := range []struct {
		els   []*knftables.Element
		del   bool
		queue func(*nftables.Set, []nftables.SetElement) error
	}{{b.Delete, true, conn.SetDeleteElements}, {b.Add, false, conn.SetAddElements}} {
		groups, err := groupBySet(part.els)
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range groups {
			fam := nftables.TableFamilyIPv4
			if g.id.family == knftables.IPv6Family {
				fam = nftables.TableFamilyIPv6
			}
			set := &nftables.Set{Table: &nftables.Table{Family: fam, Name: g.id.table}, Name: g.id.name, IsMap: g.els[0].Map != ""}
			var elems []nftables.SetElement
			for _, el := range g.els {
				enc, err := encode(el, part.del)
				if err != nil {
					t.Fatal(err)
				}
				se := nftables.SetElement{Key: enc.key, Val: enc.value}
				if enc.chain != "" {
					se.VerdictData = &expr.Verdict{Kind: expr.VerdictGoto, Chain: enc.chain}
				}
				elems = append(elems, se)
			}
			for len(elems) > 0 {
				n := min(len(elems), elementsPerMessage)
				if err := part.queue(set, elems[:n]); err != nil {
					t.Fatal(err)
				}
				elems = elems[n:]
			}
		}
	}
	_ = conn.Flush()
	return sent
}

// wireMessage is a netlink message's type, flags and data.
type wireMessage struct {
	Type, Flags uint16
	Data        []byte
}

// splitMessages splits what MarshalBinary returned into its messages,
// checking that each header's length covers its message and that sequence
// numbers and port IDs are left to the socket.
func splitMessages(t *testing.T, b []byte) []wireMessage {
	t.Helper()
	var out []wireMessage
	for len(b) > 0 {
		if len(b) < nlmsgHeaderLen {
			t.Fatalf("%d bytes left, short of a header", len(b))
		}
		n := int(binary.NativeEndian.Uint32(b))
		if n < nlmsgHeaderLen || n > len(b) || n%4 != 0 {
			t.Fatalf("message length %d of %d bytes left", n, len(b))
		}
		if seq, pid := binary.NativeEndian.Uint32(b[8:]), binary.NativeEndian.Uint32(b[12:]); seq != 0 || pid != 0 {
			t.Errorf("sequence %d, port %d: want zeros", seq, pid)
		}
		out = append(out, wireMessage{binary.NativeEndian.Uint16(b[4:]), binary.NativeEndian.Uint16(b[6:]), b[nlmsgHeaderLen:n]})
		b = b[n:]
	}
	return out
}

// TestEncodeBatchAsGoogleNftables checks that the batch ApplyElementBatch
// sends (MarshalBinary's messages, which applyElementBatch sends from the
// same encoding) is byte for byte what google/nftables made of the same
// elements: both families, every set and map, deletions by key, and sets
// of more elements than one message takes.
func TestEncodeBatchAsGoogleNftables(t *testing.T) {
	el := func(fam knftables.Family, set string, isMap bool, key []string, value ...string) *knftables.Element {
		e := &knftables.Element{Family: fam, Table: "kube-proxy", Key: key, Value: value}
		if isMap {
			e.Map = set
		} else {
			e.Set = set
		}
		return e
	}
	v4, v6 := knftables.IPv4Family, knftables.IPv6Family
	var many []*knftables.Element
	for i := range 2*elementsPerMessage + 3 {
		a := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
		many = append(many, el(v4, endpointsMap, true, []string{"10.96.0.1", "tcp", "80", fmt.Sprint(i)}, a, "8080"))
	}
	for _, tc := range []struct {
		name string
		b    ElementBatch
	}{
		{"every set, both families", ElementBatch{Add: []*knftables.Element{
			el(v4, endpointsMap, true, []string{"10.96.0.1", "udp", "53", "7"}, "10.0.0.5", "5353"),
			el(v6, nodePortEndpointsMap, true, []string{"sctp", "30080", "0"}, "fd00::5", "80"),
			el(v4, serviceIPsMap, true, []string{"10.96.0.1", "tcp", "80"}, "goto service-lb-internal-3"),
			el(v4, serviceNodePortsMap, true, []string{"tcp", "30080"}, "goto", "x"),
			el(v6, serviceIPsMap, true, []string{"fd00:96::1", "tcp", "443"}, "goto abc"),
			el(v4, clusterIPsSet, false, []string{"10.96.0.1"}),
			el(v6, hairpinSet, false, []string{"fd00::5", "fd00::5"}),
			el(v4, firewallIPsSet, false, []string{"10.96.0.9", "udp", "65535"}),
			el(v4, endpointsMap, true, []string{"10.96.0.2", "tcp", "80", "4294967295"}, "10.0.0.6", "1"),
		}}},
		{"deletions first", ElementBatch{
			Delete: []*knftables.Element{
				el(v4, serviceIPsMap, true, []string{"10.96.0.1", "tcp", "80"}, "goto a"),
				el(v4, endpointsMap, true, []string{"10.96.0.1", "tcp", "80", "0"}, "10.0.0.5", "80"),
				el(v4, serviceIPsMap, true, []string{"10.96.0.2", "tcp", "80"}, "goto b"),
			},
			Add: []*knftables.Element{el(v4, serviceIPsMap, true, []string{"10.96.0.1", "tcp", "80"}, "goto bc")},
		}},
		{"messages of 512 elements", ElementBatch{Add: many}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := googleBatch(t, tc.b)
			b, err := tc.b.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			got := splitMessages(t, b)
			var wantMsgs []wireMessage
			for _, m := range want {
				wantMsgs = append(wantMsgs, wireMessage{uint16(m.Header.Type), uint16(m.Header.Flags), m.Data})
			}
			if diff := cmp.Diff(wantMsgs, got); diff != "" {
				t.Errorf("MarshalBinary differs from google/nftables' batch (-google +ours):\n%s", diff)
			}
		})
	}
}

// TestMarshalBinaryRefuses checks that a batch holding an element the
// netlink path does not take fails whole, wherever the element stands,
// as ApplyElementBatch fails before sending anything.
func TestMarshalBinaryRefuses(t *testing.T) {
	good := &knftables.Element{Family: knftables.IPv4Family, Table: "t", Set: clusterIPsSet, Key: []string{"10.96.0.1"}}
	for _, tc := range []struct {
		name string
		bad  knftables.Element
	}{
		{"short key", knftables.Element{Family: knftables.IPv4Family, Table: "t", Set: firewallIPsSet, Key: []string{"10.96.0.1", "tcp"}}},
		{"short value", knftables.Element{Family: knftables.IPv4Family, Table: "t", Map: endpointsMap, Key: []string{"10.96.0.1", "tcp", "80", "0"}, Value: []string{"10.0.0.1"}}},
		{"comment", knftables.Element{Family: knftables.IPv4Family, Table: "t", Set: clusterIPsSet, Key: []string{"10.96.0.2"}, Comment: ptr.To("x")}},
		{"no table", knftables.Element{Family: knftables.IPv4Family, Set: clusterIPsSet, Key: []string{"10.96.0.2"}}},
		{"not a goto", knftables.Element{Family: knftables.IPv4Family, Table: "t", Map: serviceIPsMap, Key: []string{"10.96.0.1", "tcp", "80"}, Value: []string{"accept"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, b := range []ElementBatch{
				{Add: []*knftables.Element{good, &tc.bad}},
				{Delete: []*knftables.Element{good}, Add: []*knftables.Element{good, good, &tc.bad}},
			} {
				if msgs, err := b.MarshalBinary(); err == nil {
					t.Errorf("%d elements: encoded %d bytes, want an error", b.Len(), len(msgs))
				}
			}
		})
	}
}
