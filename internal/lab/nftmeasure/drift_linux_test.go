package nftmeasure

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"
)

// TestEndpointKeyElement checks that endpointKeyElement reads back the
// keys the translator encodes (TCP only; UDP by its protocol byte), and
// refuses what is not such a key.
func TestEndpointKeyElement(t *testing.T) {
	for _, tc := range []struct {
		key   []string
		proto byte // 0: as encoded
		want  []string
	}{
		{key: []string{"172.30.0.5", "tcp", "80", "3"}, want: []string{"172.30.0.5", "tcp", "80", "3"}},
		{key: []string{"192.0.2.1", "tcp", "65535", "70000"}, want: []string{"192.0.2.1", "tcp", "65535", "70000"}},
		{key: []string{"10.96.1.2", "tcp", "53", "0"}, proto: 17, want: []string{"10.96.1.2", "udp", "53", "0"}},
	} {
		enc, err := encodeElement(EndpointsDataMap, &knftables.Element{Map: EndpointsDataMap, Key: tc.key, Value: []string{"10.0.0.1", "8080"}})
		if err != nil {
			t.Fatal(err)
		}
		if tc.proto != 0 {
			enc.Key[4] = tc.proto
		}
		got, err := endpointKeyElement(string(enc.Key))
		if err != nil {
			t.Fatalf("key %v: %v", tc.key, err)
		}
		if diff := cmp.Diff(tc.want, got.Key); diff != "" {
			t.Errorf("key read back (-want +got):\n%s", diff)
		}
	}
	for _, bad := range []string{"", "short", string(make([]byte, 16))} {
		if e, err := endpointKeyElement(bad); err == nil {
			t.Errorf("endpointKeyElement(%q) = %v, want an error", bad, e.Key)
		}
	}
}

// TestDetectDriftInUnwantedEndpoint checks that an element of the endpoint
// map that nothing wants is found when its key is in scope, and deleted by
// the repair, leaving the table as loaded.
func TestDetectDriftInUnwantedEndpoint(t *testing.T) {
	svcs, n := loadedDataMap(t, 50)
	fresh := n.list(t)
	n.ns.MustExec(t, "nft", "add", "element", "ip", Table, EndpointsDataMap, "{ 172.30.0.5 . tcp . 80 . 12 : 10.99.0.1 . 1 }")
	enc, err := encodeElement(EndpointsDataMap, &knftables.Element{Map: EndpointsDataMap,
		Key: []string{"172.30.0.5", "tcp", "80", "12"}, Value: []string{"10.99.0.1", "1"}})
	if err != nil {
		t.Fatal(err)
	}
	wanted, err := encodeElement(EndpointsDataMap, &knftables.Element{Map: EndpointsDataMap,
		Key: []string{"172.30.0.5", "tcp", "80", "3"}, Value: []string{"10.99.0.1", "1"}})
	if err != nil {
		t.Fatal(err)
	}
	skeleton, elements := DataMapLoad(svcs)
	scope := &Scope{EndpointKeys: map[string]bool{string(enc.Key): true, string(wanted.Key): true}}
	d, err := DetectDriftIn(n.conn(t), mustDesired(t, skeleton, elements), scope)
	if err != nil {
		t.Fatal(err)
	}
	if d.Extra() != 1 || len(d.Elements) != 0 || len(d.Chains) != 0 {
		t.Fatalf("drift: chains %v, elements %v, %d extra; want the one extra element", d.Chains, d.Elements, d.Extra())
	}
	conn := n.conn(t)
	if err := RepairElements(conn, d); err != nil {
		t.Fatal(err)
	}
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := n.list(t); got != fresh {
		t.Errorf("after the repair nft lists another table than the fresh load:\n%s", cmp.Diff(fresh, got))
	}
}
