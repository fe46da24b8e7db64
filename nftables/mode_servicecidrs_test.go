package nftables

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/proxy"
)

// TestSyncPassesServiceCIDRs checks, through a dry run, that the
// FamilyInput's service CIDRs reach the writer: the first sync drops
// connections to them, and a change of them prints a full transaction
// with the new ranges.
func TestSyncPassesServiceCIDRs(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	var out bytes.Buffer
	b, err := NewMode(ctx, WriterConfig{Family: v1.IPv6Protocol}, nil, WithDryRun(&out))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	in := &proxy.FamilyInput{Family: v1.IPv6Protocol, Services: changetracker.ServicePortMap{}, Endpoints: changetracker.EndpointsMap{},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:96::/112")}}
	if _, err := b.Sync(ctx, []*proxy.FamilyInput{in}); err != nil {
		t.Fatal(err)
	}
	if want := "add rule ip6 kube-proxy cluster-ips-check ip6 daddr { fd00:96::/112 } drop\n"; !strings.Contains(out.String(), want) {
		t.Errorf("first sync's transaction lacks %q:\n%s", want, out.String())
	}
	out.Reset()
	in.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("fd00:97::/112")}
	// Full: every port is judged again against the new ranges.
	if outs, err := b.Sync(ctx, []*proxy.FamilyInput{in}); err != nil || !outs[0].Full {
		t.Fatalf("sync after a change of ranges: %v, %+v; want a full one", err, outs)
	}
	if want := "add rule ip6 kube-proxy cluster-ips-check ip6 daddr { fd00:97::/112 } drop\n"; !strings.Contains(out.String(), want) {
		t.Errorf("transaction after a change of ranges lacks %q:\n%s", want, out.String())
	}
	if old := "fd00:96::/112"; strings.Contains(out.String(), old) {
		t.Errorf("transaction after a change of ranges still has %s:\n%s", old, out.String())
	}
}
