package nftables

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestDecodeFields checks that the watcher reads a key of every set it
// follows back as the writer wrote it, for both families, and refuses a
// key of the wrong length or an unknown protocol.
func TestDecodeFields(t *testing.T) {
	for _, tc := range []struct {
		set string
		v6  bool
		key []string
	}{
		{endpointsMap, false, []string{"10.96.0.10", "tcp", "80", "7"}},
		{endpointsMap, true, []string{"fd00:96::10", "sctp", "65535", "0"}},
		{nodePortEndpointsMap, false, []string{"udp", "30080", "12"}},
		{serviceIPsMap, true, []string{"2001:db8::5", "tcp", "443"}},
		{serviceNodePortsMap, false, []string{"tcp", "30001"}},
		{clusterIPsSet, false, []string{"10.96.0.1"}},
		{hairpinSet, true, []string{"fd00:10::11", "fd00:10::11"}},
		{firewallIPsSet, false, []string{"203.0.113.5", "tcp", "80"}},
		{noEndpointServicesMap, false, []string{"10.96.0.2", "udp", "53"}},
		{noEndpointNodePortsMap, true, []string{"sctp", "30002"}},
	} {
		spec := checkSets[tc.set]
		b, err := encodeFields(spec.key, tc.key, tc.v6)
		if err != nil {
			t.Fatalf("%s %v: %v", tc.set, tc.key, err)
		}
		got, ok := decodeFields(spec.key, b, tc.v6)
		if diff := cmp.Diff(strings.Join(tc.key, " . "), got); !ok || diff != "" {
			t.Errorf("%s: decoded ok=%v (-want +got):\n%s", tc.set, ok, diff)
		}
		if _, ok := decodeFields(spec.key, b[:len(b)-1], tc.v6); ok {
			t.Errorf("%s: a short key decoded", tc.set)
		}
		if _, ok := decodeFields(spec.key, append(b, 0), tc.v6); ok {
			t.Errorf("%s: a long key decoded", tc.set)
		}
	}
	b, _ := encodeFields(checkSets[serviceNodePortsMap].key, []string{"tcp", "80"}, false)
	b[0] = 1 // ICMP
	if _, ok := decodeFields(checkSets[serviceNodePortsMap].key, b, false); ok {
		t.Error("a key of protocol 1 decoded")
	}
}
