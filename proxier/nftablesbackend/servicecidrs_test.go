package nftablesbackend

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxier"
)

// TestSyncPassesServiceCIDRs checks, through a dry run, that the
// FamilyInput's service CIDRs reach the writer: the first sync drops
// connections to them, and a change of them prints a partial transaction
// of the cluster-ips-check chain alone.
func TestSyncPassesServiceCIDRs(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	var out bytes.Buffer
	b, err := New(ctx, nftables.WriterConfig{IPFamily: v1.IPv6Protocol}, nil, WithDryRun(&out))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	in := &proxier.FamilyInput{Family: v1.IPv6Protocol, Services: changetracker.ServicePortMap{}, Endpoints: changetracker.EndpointsMap{},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00:96::/112")}}
	if _, err := b.Sync(ctx, []*proxier.FamilyInput{in}); err != nil {
		t.Fatal(err)
	}
	if want := "add rule ip6 kube-proxy cluster-ips-check ip6 daddr { fd00:96::/112 } drop\n"; !strings.Contains(out.String(), want) {
		t.Errorf("first sync's transaction lacks %q:\n%s", want, out.String())
	}
	out.Reset()
	in.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("fd00:97::/112")}
	if outs, err := b.Sync(ctx, []*proxier.FamilyInput{in}); err != nil || outs[0].Full {
		t.Fatalf("sync after a change of ranges: %v, %+v; want a partial one", err, outs)
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if !strings.HasPrefix(l, "#") {
			got = append(got, l)
		}
	}
	want := []string{
		"add chain ip6 kube-proxy cluster-ips-check",
		"flush chain ip6 kube-proxy cluster-ips-check",
		"add rule ip6 kube-proxy cluster-ips-check ip6 daddr @cluster-ips reject",
		"add rule ip6 kube-proxy cluster-ips-check ip6 daddr { fd00:97::/112 } drop",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("transaction of a change of ranges (-want +got):\n%s", diff)
	}
}
