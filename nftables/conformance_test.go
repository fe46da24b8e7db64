package nftables_test

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxy"
	"github.com/proxykit/proxykit/proxy/proxytest"
)

// failingNFT is a knftables.Fake whose next transaction fails, changing
// nothing, as nft refuses a transaction whole, when failNext is set.
type failingNFT struct {
	*knftables.Fake
	failNext atomic.Bool
}

func (f *failingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	if f.failNext.Swap(false) {
		return errors.New("nft: failed on purpose")
	}
	return f.Fake.Run(ctx, tx)
}

// TestConformance runs proxytest's suite on the Backend of each family
// over a knftables.Fake, whose dump is the state compared.
func TestConformance(t *testing.T) {
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		t.Run(string(family), proxytest.Suite{
			Families: []v1.IPFamily{family},
			New: func(t testing.TB, node proxy.NodeConfig) (proxy.Backend, proxytest.Datapath) {
				_, ctx := ktesting.NewTestContext(t)
				nftFamily := knftables.IPv4Family
				if family == v1.IPv6Protocol {
					nftFamily = knftables.IPv6Family
				}
				fake := knftables.NewFake(nftFamily, nftables.DefaultTableName)
				nft := &failingNFT{Fake: fake}
				b, err := nftables.NewMode(ctx, nftables.WriterConfig{Family: family, Node: node}, nft,
					nftables.WithTableLookup(func(context.Context) (bool, error) {
						fake.RLock()
						defer fake.RUnlock()
						return fake.Table != nil, nil
					}))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = b.Close() })
				return b, proxytest.Datapath{
					Dump:          func() string { return normalize(fake.Dump()) },
					FailNextApply: func() { nft.failNext.Store(true) },
					// As nft delete table, or nft flush ruleset, would.
					Wipe: func() {
						tx := fake.NewTransaction()
						tx.Delete(&knftables.Table{})
						if err := fake.Run(ctx, tx); err != nil {
							t.Fatal(err)
						}
					},
				}
			},
		}.Run)
	}
}

var (
	// element matches an element line and names its set or map.
	element = regexp.MustCompile(`^add element \S+ \S+ (\S+) `)
	// sharedChain matches the line of a shared load-balancing chain, or
	// of one of its rules, and names the chain.
	sharedChain = regexp.MustCompile(`^add (?:chain|rule) \S+ \S+ (lb-\S+)`)
	// endpointIndex matches the index in the key of an element of an
	// endpoints map.
	endpointIndex = regexp.MustCompile(`^(add element \S+ \S+ \S*endpoints \{ [^:]*\. )\d+( :)`)
	// reference matches a verdict naming a chain.
	reference = regexp.MustCompile(`(?:goto|jump) ([^ ,}]+)`)
)

// normalize makes a knftables.Fake dump independent of the order the
// Backend wrote things in, and of what the writer keeps on purpose but no
// packet reaches. It sorts the elements of each set and map, whose order
// means nothing to nft; it leaves out the index in the keys of the
// endpoints maps, since a service port's endpoints are picked at random
// among its indexes and a partial sync gives a new endpoint the index a
// full sync may give another (nftables.Writer's doc); and it leaves out the shared load-balancing chains
// (lb-*) that nothing refers to, which a partial sync keeps when their
// last user goes and the next full sync deletes (nftables.Writer's doc).
func normalize(dump string) string {
	lines := strings.Split(dump, "\n")
	referred := map[string]bool{}
	for _, l := range lines {
		for _, m := range reference.FindAllStringSubmatch(l, -1) {
			referred[m[1]] = true
		}
	}
	lines = slices.DeleteFunc(lines, func(l string) bool {
		m := sharedChain.FindStringSubmatch(l)
		return m != nil && !referred[m[1]]
	})
	for i, l := range lines {
		lines[i] = endpointIndex.ReplaceAllString(l, "${1}*${2}")
	}
	return proxytest.SortRuns(strings.Join(lines, "\n"), func(line string) string {
		if m := element.FindStringSubmatch(line); m != nil {
			return m[1]
		}
		return ""
	})
}
