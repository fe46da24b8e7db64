package ebpf

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxykit/proxykit/changetracker"
)

// TestDryRunNamesEscaped checks that the names a dry run prints, which
// come from the API, cannot break its lines or carry terminal escapes.
func TestDryRunNamesEscaped(t *testing.T) {
	f := Frontend{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Protocol: v1.ProtocolTCP}
	for _, tc := range []struct {
		name changetracker.ServicePortName
		want string
	}{
		{changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web"}, Port: "http"}, "ns/web:http"},
		{changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web\nservice 10.0.0.1:80/TCP"}, Port: "http"}, `"ns/web\nservice 10.0.0.1:80/TCP:http"`},
		{changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "web"}, Port: "\x1b[2J"}, `"ns/web:\x1b[2J"`},
	} {
		got := ownerName(map[Frontend]changetracker.ServicePortName{f: tc.name}, f)
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("name %q (-want +got):\n%s", tc.name.String(), diff)
		}
	}
	if got := ownerName(nil, f); got != "(no owner)" {
		t.Errorf("a frontend without an owner prints %q, want (no owner)", got)
	}
}
