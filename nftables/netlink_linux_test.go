package nftables_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxy"
)

// TestWriterSplitFirstLoadKernel loads one cluster into two namespaces,
// per family: through nft alone, and split (WriterConfig.SplitFirstLoad:
// the skeleton through nft, the elements through ApplyElements). Every
// set and map then holds the same elements in both, as the kernel lists
// them, and so after a partial sync and after a forced full sync, which
// are not split.
func TestWriterSplitFirstLoadKernel(t *testing.T) {
	kerneltest.Require(t, "nft")
	for _, fam := range []struct {
		family    v1.IPFamily
		nft       knftables.Family
		a, b, lb  string
		cidr, src string
	}{
		{v1.IPv4Protocol, knftables.IPv4Family, "10.0.1.1", "10.0.2.1", "203.0.113.5", "10.0.0.0/16", "198.51.100.0/24"},
		{v1.IPv6Protocol, knftables.IPv6Family, "fd00::1:1", "fd00::2:1", "2001:db8::5", "fd00::/64", "2001:db8:1::/64"},
	} {
		t.Run(string(fam.family), func(t *testing.T) {
			c := newCluster(fam.family, node)
			svcIP := func(i int) string {
				if fam.family == v1.IPv6Protocol {
					return fmt.Sprintf("fd00:96::%x", i)
				}
				return fmt.Sprintf("10.96.0.%d", i)
			}
			c.setService(makeService("ns", "web", svcIP(1), withNodePort(30080), withExternalIPs(fam.lb)))
			c.setEndpoints("ns", "web", tcp8080, local(fam.a), remote(fam.b))
			c.setService(makeService("ns", "lb", svcIP(2), withLoadBalancer(fam.lb, fam.src), withNodePort(30081)))
			c.setEndpoints("ns", "lb", tcp8080, remote(fam.b))
			c.setService(makeService("ns", "dns", svcIP(3), withPorts(
				v1.ServicePort{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP},
				v1.ServicePort{Name: "sctp", Port: 9999, Protocol: v1.ProtocolSCTP})))
			c.setEndpoints("ns", "dns", []discoveryv1.EndpointPort{slicePort("dns", 5353, v1.ProtocolUDP), slicePort("sctp", 9999, v1.ProtocolSCTP)}, local(fam.a))
			c.setService(makeService("ns", "sticky", svcIP(4), withAffinity(60)))
			c.setEndpoints("ns", "sticky", tcp8080, local(fam.a))
			c.setService(makeService("ns", "local", svcIP(5), withNodePort(30085), withExternalLocal()))
			c.setEndpoints("ns", "local", tcp8080, local(fam.a), remote(fam.b))
			c.setService(makeService("ns", "empty", svcIP(6), withNodePort(30086)))

			type side struct {
				ns  *kerneltest.NS
				nft knftables.Interface
				w   *nftables.Writer
			}
			sides := make([]side, 2)
			for i := range sides {
				s := &sides[i]
				s.ns = kerneltest.NewNS(t)
				s.nft = nsNFT(t, s.ns, fam.nft)
				cfg := nftables.WriterConfig{Family: fam.family, Node: proxy.NodeConfig{Name: node, ClusterCIDRs: []netip.Prefix{prefix(fam.cidr)}}, SplitFirstLoad: i == 1}
				var err error
				if s.w, err = nftables.NewWriter(s.nft, cfg); err != nil {
					t.Fatal(err)
				}
			}
			sync := func(what string, wantSplit bool) {
				t.Helper()
				in := c.input() // once: it takes the trackers' changes
				for i := range sides {
					s := &sides[i]
					res := syncIn(t, s.ns, s.w, in)
					if split := len(res.Elements) > 0; split != (wantSplit && i == 1) {
						t.Fatalf("%s, writer %d: %d elements split off", what, i, len(res.Elements))
					}
					err := s.ns.Do(func() error {
						if err := s.nft.Run(context.Background(), res.Transaction); err != nil {
							return err
						}
						return nftables.ApplyElements(res.Elements)
					})
					s.w.Applied(err)
					if err != nil {
						t.Fatalf("%s, writer %d: %v", what, i, err)
					}
				}
				want, got := kernelElements(t, sides[0].ns, sides[0].nft), kernelElements(t, sides[1].ns, sides[1].nft)
				if len(want) < 10 {
					t.Fatalf("%s: only %d elements in the table:\n%s", what, len(want), strings.Join(want, "\n"))
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("%s: elements through nft (-) and split through netlink (+):\n%s", what, diff)
				}
			}
			sync("first load", true)
			c.setEndpoints("ns", "web", tcp8080, remote(fam.b))
			sync("partial sync", false)
			sides[0].w.RequestFullSync()
			sides[1].w.RequestFullSync()
			sync("full resync", false)
		})
	}
}

// kernelElements lists every element of every set and map of the table
// in ns, as the kernel holds them, sorted.
func kernelElements(t *testing.T, ns *kerneltest.NS, nft knftables.Interface) []string {
	t.Helper()
	var out []string
	err := ns.Do(func() error {
		for _, kind := range []string{"set", "map"} {
			names, err := nft.List(context.Background(), kind)
			if err != nil {
				return err
			}
			for _, name := range names {
				elems, err := nft.ListElements(context.Background(), kind, name)
				if err != nil {
					return fmt.Errorf("%s %s: %w", kind, name, err)
				}
				for _, e := range elems {
					out = append(out, fmt.Sprintf("%s %s { %s : %s }", kind, name, strings.Join(e.Key, " . "), strings.Join(e.Value, " . ")))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}
