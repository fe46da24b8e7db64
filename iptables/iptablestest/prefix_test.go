package iptablestest

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPrefixLines(t *testing.T) {
	dump := "*nat\n:KUBE-SERVICES - [0:0]\n:PXYB-SERVICES - [0:0]\n-A PREROUTING -j PXYB-SERVICES\n-A KUBEB-X -j RETURN\nCOMMIT\n"
	want := []string{":PXYB-SERVICES - [0:0]\n", "-A PREROUTING -j PXYB-SERVICES\n"}
	if diff := cmp.Diff(want, PrefixLines(dump, "PXYB")); diff != "" {
		t.Errorf("PXYB lines (-want +got):\n%s", diff)
	}
	if got := PrefixLines(dump, "OTHER"); got != nil {
		t.Errorf("OTHER lines = %q, want none", got)
	}
}
