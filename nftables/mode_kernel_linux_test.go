package nftables

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/proxy"
)

// kernelFamily is a Mode over the real nft in a throwaway namespace.
type kernelFamily struct {
	ns     *kerneltest.NS
	b      *Mode
	family v1.IPFamily
	svcs   changetracker.ServicePortMap
	eps    changetracker.EndpointsMap
	// fullNext is the next sync's FamilyInput.Full, set by the tests'
	// lost as the Proxier sets it.
	fullNext atomic.Bool
}

// newKernelFamily makes a Mode of family in ns, its table check's
// socket opened there, with services ns/svc-0 .. svc-<n-1>, each with
// endpoints endpoints.
func newKernelFamily(t testing.TB, ns *kerneltest.NS, family v1.IPFamily, n, endpoints int, opts ...ModeOption) *kernelFamily {
	t.Helper()
	return newKernelFamilyConfig(t, ns, WriterConfig{Family: family, Node: proxy.NodeConfig{Name: "node-a"}}, n, endpoints, opts...)
}

// newKernelFamilyConfig is newKernelFamily with the writer's
// configuration (its family, and whatever else NewMode does not set).
func newKernelFamilyConfig(t testing.TB, ns *kerneltest.NS, cfg WriterConfig, n, endpoints int, opts ...ModeOption) *kernelFamily {
	t.Helper()
	family := cfg.Family
	nftFamily := knftables.IPv4Family
	if family == v1.IPv6Protocol {
		nftFamily = knftables.IPv6Family
	}
	k := &kernelFamily{ns: ns, family: family, svcs: changetracker.ServicePortMap{}, eps: changetracker.EndpointsMap{}}
	ctx := klog.NewContext(context.Background(), klog.Background().V(10))
	if err := ns.Do(func() error {
		nft, err := knftables.New(nftFamily, DefaultTableName)
		if err != nil {
			return err
		}
		k.b, err = NewMode(ctx, cfg, nft, opts...)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.b.Close() })
	quiet := changetracker.WithLogger(klog.Background().V(10))
	st := changetracker.NewServiceChangeTracker(family, nil, quiet)
	et := changetracker.NewEndpointsChangeTracker(family, "node-a", nil, quiet)
	addrType := discoveryv1.AddressTypeIPv4
	if family == v1.IPv6Protocol {
		addrType = discoveryv1.AddressTypeIPv6
	}
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		ip := ipOf(family, 0x60_00_00+i)
		st.Update(nil, &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec: v1.ServiceSpec{ClusterIP: ip, ClusterIPs: []string{ip},
				Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}},
		})
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: addrType,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		}
		for e := range endpoints {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ipOf(family, 0xf4_00_00+i*endpoints+e)},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
		}
		et.EndpointSliceUpdate(s, false)
	}
	k.sync(t, k.svcs.Update(st), k.eps.Update(et))
	return k
}

// ipOf returns the address n inside 10.0.0.0/8 or fd00::/104.
func ipOf(family v1.IPFamily, n int) string {
	if family == v1.IPv6Protocol {
		return netip.AddrFrom16([16]byte{0: 0xfd, 13: byte(n >> 16), 14: byte(n >> 8), 15: byte(n)}).String()
	}
	return netip.AddrFrom4([4]byte{10, byte(n >> 16), byte(n >> 8), byte(n)}).String()
}

func (k *kernelFamily) sync(t testing.TB, sc changetracker.UpdateServiceMapResult, ec changetracker.UpdateEndpointsMapResult) bool {
	t.Helper()
	var outs []proxy.SyncResult
	if err := k.ns.Do(func() (err error) {
		outs, err = k.b.Sync(context.Background(), []*proxy.FamilyInput{{Family: k.family, Services: k.svcs, Endpoints: k.eps,
			ServiceChanges: sc, EndpointChanges: ec, NodeLabels: map[string]string{}, Full: k.fullNext.Swap(false)}})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return outs[0].Full
}

// TestKernelTableDeleted checks, with the real nft and kernel and for each
// family, that the default table check finds the table after a sync, that
// Run calls lost once another program deletes it (nft delete table), and
// that the full sync lost brings creates it again.
func TestKernelTableDeleted(t *testing.T) {
	kerneltest.Require(t, "nft")
	ns := kerneltest.NewNS(t)
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		t.Run(string(family), func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			k := newKernelFamily(t, ns, family, 3, 2, WithCheckPeriod(10*time.Millisecond))
			if ok, err := k.b.lookup(ctx); err != nil || !ok {
				t.Fatalf("table lookup after a sync: %v, %v; want it found", ok, err)
			}
			lost := make(chan struct{}, 1)
			ctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() {
				k.b.Run(ctx, func() {
					select {
					case lost <- struct{}{}:
					default:
					}
				})
				close(done)
			}()
			defer func() { cancel(); <-done }()
			time.Sleep(100 * time.Millisecond)
			select {
			case <-lost:
				t.Fatal("lost called while the table exists")
			default:
			}
			ns.MustExec(t, "nft", "delete", "table", string(k.b.Family()), k.b.Table())
			select {
			case <-lost:
			case <-time.After(10 * time.Second):
				t.Fatal("lost not called within 10s of the table's deletion")
			}
			k.fullNext.Store(true)
			if !k.sync(t, changetracker.UpdateServiceMapResult{}, changetracker.UpdateEndpointsMapResult{}) {
				t.Error("the sync after the loss was partial")
			}
			if ok, err := k.b.lookup(ctx); err != nil || !ok {
				t.Errorf("table lookup after the repair: %v, %v; want it found", ok, err)
			}
			out := ns.MustExec(t, "nft", "list", "table", string(k.b.Family()), k.b.Table())
			if ip := ipOf(family, 0x60_00_00+2); !strings.Contains(out, ip+" . tcp . 80") {
				t.Errorf("the repaired table lacks ns/svc-2's %s:\n%s", ip, out)
			}
		})
	}
}

// TestKernelDryRunChecks checks that what a dry run prints, both families
// one after the other as the example prints them, is what nft -f takes: nft
// --check accepts it in an empty namespace.
func TestKernelDryRunChecks(t *testing.T) {
	kerneltest.Require(t, "nft")
	_, ctx := ktesting.NewTestContext(t)
	var out bytes.Buffer
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		b, err := NewMode(ctx, WriterConfig{Family: family, Node: proxy.NodeConfig{Name: "node-a", MasqueradeAll: true}}, nil, WithDryRun(&out))
		if err != nil {
			t.Fatal(err)
		}
		ip, ep := "10.96.0.10", "10.244.0.11"
		if family == v1.IPv6Protocol {
			ip, ep = "fd00:96::10", "fd00:244::11"
		}
		svcs, eps := changetracker.ServicePortMap{}, changetracker.EndpointsMap{}
		st := changetracker.NewServiceChangeTracker(family, nil)
		et := changetracker.NewEndpointsChangeTracker(family, "node-a", nil)
		svc := service("web", ip)
		svc.Spec.Type = v1.ServiceTypeLoadBalancer
		svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		svc.Spec.Ports[0].NodePort = 30080
		st.Update(nil, svc)
		sl := slice("web", ep)
		if family == v1.IPv6Protocol {
			sl.AddressType = discoveryv1.AddressTypeIPv6
		}
		et.EndpointSliceUpdate(sl, false)
		if _, err := b.Sync(ctx, []*proxy.FamilyInput{{Family: family, Services: svcs, Endpoints: eps,
			ServiceChanges: svcs.Update(st), EndpointChanges: eps.Update(et), NodeLabels: map[string]string{}}}); err != nil {
			t.Fatal(err)
		}
	}
	kerneltest.CheckNFT(t, out.Bytes())
}

// BenchmarkTableCheck measures, at 10,000 services of 10 endpoints in a
// namespace, the ways Run could find out whether its table is still
// there: the netlink request it makes, "nft list tables", and knftables'
// List of the table's chains (which lists the whole table).
func BenchmarkTableCheck(b *testing.B) {
	kerneltest.Require(b, "nft")
	ns := kerneltest.NewNS(b)
	k := newKernelFamily(b, ns, v1.IPv4Protocol, 10000, 10)
	ctx := context.Background()
	b.Run("netlink", func(b *testing.B) {
		for b.Loop() {
			if ok, err := k.b.lookup(ctx); err != nil || !ok {
				b.Fatal(ok, err)
			}
		}
	})
	b.Run("nft-list-tables", func(b *testing.B) {
		for b.Loop() {
			if out := ns.MustExec(b, "nft", "list", "tables", "ip"); !strings.Contains(out, k.b.Table()) {
				b.Fatal(out)
			}
		}
	})
	b.Run("knftables-List-chains", func(b *testing.B) {
		var nft knftables.Interface
		if err := ns.Do(func() (err error) { nft, err = knftables.New(knftables.IPv4Family, k.b.Table()); return err }); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if err := ns.Do(func() error { _, err := nft.List(ctx, "chains"); return err }); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestKernelPeriodicResync checks, with the real nft and kernel and for
// each family, that the Mode's periodic resync follows nf_tables'
// commits and reads the kernel instead of rewriting the table: with
// nothing committed since its own sync, or only another program's commit
// to another table, it is partial, and an element deleted by hand is put
// back by a partial sync, not a full one.
func TestKernelPeriodicResync(t *testing.T) {
	kerneltest.Require(t, "nft")
	ns := kerneltest.NewNS(t)
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		t.Run(string(family), func(t *testing.T) {
			// Every sync is due for a resync.
			k := newKernelFamily(t, ns, family, 3, 2, withFullSyncPeriod(time.Nanosecond))
			none := func() bool {
				return k.sync(t, changetracker.UpdateServiceMapResult{}, changetracker.UpdateEndpointsMapResult{})
			}
			if k.b.watcher == nil {
				t.Error("the Mode does not follow nf_tables' commits; want a KernelWatcher")
			}
			if none() {
				t.Error("the resync with nothing changed was a full sync; want it skipped")
			}
			fam, table := string(k.b.Family()), k.b.Table()
			// Another program's commit to a table of its own.
			ns.MustExec(t, "nft", "add", "table", fam, "other-"+table)
			if none() {
				t.Error("the resync after another program's commit to its own table was a full sync")
			}
			key := ipOf(family, 0x60_00_00+1) + " . tcp . 80 . 0"
			list := func() string { return ns.MustExec(t, "nft", "list", "map", fam, table, "endpoints") }
			if !strings.Contains(list(), key) {
				t.Fatalf("the endpoints map lacks %q:\n%s", key, list())
			}
			ns.MustExec(t, "nft", "delete", "element", fam, table, "endpoints", "{ "+key+" }")
			if strings.Contains(list(), key) {
				t.Fatalf("the element %q is still there after its deletion", key)
			}
			if none() {
				t.Error("the resync after an element's deletion was a full sync; want a partial repair")
			}
			if !strings.Contains(list(), key) {
				t.Errorf("the resync did not put back %q:\n%s", key, list())
			}
		})
	}
}

// TestKernelSplitFirstLoad checks, with the real nft and kernel and for
// each family, that withSplitFirstLoad's first sync (into a missing table)
// leaves the endpoints in the kernel although they went through netlink,
// and that later partial syncs work on that table.
func TestKernelSplitFirstLoad(t *testing.T) {
	kerneltest.Require(t, "nft")
	ns := kerneltest.NewNS(t)
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		t.Run(string(family), func(t *testing.T) {
			var sent int
			apply := func(els []*knftables.Element) error {
				sent += len(els)
				return ApplyElements(els)
			}
			k := newKernelFamily(t, ns, family, 3, 2, withSplitFirstLoad(apply))
			if sent == 0 {
				t.Fatal("the first load sent no element through netlink")
			}
			fam, table := string(k.b.Family()), k.b.Table()
			out := ns.MustExec(t, "nft", "list", "map", fam, table, "endpoints")
			for i := range 3 {
				for e := range 2 {
					key := fmt.Sprintf("%s . tcp . 80 . %d", ipOf(family, 0x60_00_00+i), e)
					if !strings.Contains(out, key) {
						t.Errorf("the endpoints map lacks %q:\n%s", key, out)
					}
				}
			}
			before := sent
			if k.sync(t, changetracker.UpdateServiceMapResult{}, changetracker.UpdateEndpointsMapResult{}) {
				t.Error("the sync after the split load was full")
			}
			if sent != before {
				t.Errorf("a sync into the existing table sent %d elements through netlink; only a load into a missing table is split", sent-before)
			}
		})
	}
}
