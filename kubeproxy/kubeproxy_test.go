package kubeproxy

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/ipset/ipsettest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/ipvs/ipvstest"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/kernel"
)

// cluster is node-a (192.168.10.11) and Service default/web, cluster IP
// 10.96.0.10 port 80/TCP, with one ready endpoint, 10.244.1.10:8080.
func cluster() kubernetes.Interface {
	port, ready := int32(8080), true
	return fake.NewClientset(
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.168.10.11"}}}},
		&v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"}, Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}, IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		}},
		&discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.10"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
			Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: &port, Protocol: ptr(v1.ProtocolTCP)}},
		},
	)
}

func ptr[T any](v T) *T { return &v }

// untouchable is a Host every part of which fails t: what a dry run must
// not use.
func untouchable(t *testing.T) *Host {
	fail := func(what string) error {
		t.Errorf("a dry run used the host's %s", what)
		return errors.New("not in a dry run")
	}
	return &Host{
		DetectBackend: func(context.Context) (iptables.Backend, error) { return "", fail("iptables backend") },
		NewIPTables: func(context.Context, v1.IPFamily, iptables.Backend) (iptables.Interface, error) {
			return nil, fail("iptables")
		},
		OpenIPVS: func(context.Context, bool) (*ipvsmode.Handles, error) { return nil, fail("IPVS") },
		NewNFTables: func(context.Context, knftables.Family, string) (knftables.Interface, error) {
			return nil, fail("nft")
		},
		HostAddresses: func() ([]netip.Addr, error) { return nil, fail("addresses") },
		Listen:        func(context.Context, string, string) (net.Listener, error) { return nil, fail("listener") },
	}
}

// TestNewDryRun: in each mode, New's proxier prints the Service in the
// mode's format with the Config's chain prefix, and touches nothing of
// the host.
func TestNewDryRun(t *testing.T) {
	for _, tc := range []struct {
		mode string
		want []string
	}{
		{ModeIPTables, []string{"# IPv4: iptables-restore input\n", "-A PROXY-SERVICES -m comment --comment \"default/web:http cluster IP\" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j PROXY-SVC-"}},
		{ModeIPVS, []string{"TCP 10.96.0.10:80 rr bound\n  -> 10.244.1.10:8080", "add PROXY-CLUSTER-IP 10.96.0.10,tcp:80\n"}},
		{ModeNFTables, []string{"# IPv4: nft -f input for table ip proxy-proxy\n", "add element ip proxy-proxy endpoints { 10.96.0.10 . tcp . 80 . 0 : 10.244.1.10 . 8080 }\n"}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			var out bytes.Buffer
			cfg := &Config{Mode: tc.mode, ChainPrefix: "PROXY", HealthzBindAddress: "127.0.0.1:10256"}
			p, err := New(cluster(), "node-a", cfg, WithHost(untouchable(t)), WithDryRun(&out))
			if err != nil {
				t.Fatal(err)
			}
			if err := p.RunOnce(context.Background()); err != nil {
				t.Fatal(err)
			}
			for _, want := range tc.want {
				if !strings.Contains(out.String(), want) {
					t.Errorf("the dry run does not print %q:\n%s", want, out.String())
				}
			}
		})
	}
}

func TestNewRefusesInvalidConfig(t *testing.T) {
	if _, err := New(cluster(), "node-a", &Config{Mode: "userspace"}); err == nil || !strings.Contains(err.Error(), `Mode "userspace"`) {
		t.Errorf("New with an invalid Config: %v, want Validate's error", err)
	}
}

// fakeHost is a node of fakes: iptables of both families, nft, ipsets and
// the dummy interface, and a kernel tree with no module loaded.
type fakeHost struct {
	ipt4, ipt6 *iptablestest.Fake
	nft        map[knftables.Family]*knftables.Fake
	lb         *ipvstest.Fake
	sets       *ipsettest.Fake
	binder     binder
	root       string
}

func newFakeHost(t *testing.T) (*fakeHost, *Host) {
	f := &fakeHost{
		nft:    map[knftables.Family]*knftables.Fake{},
		lb:     ipvstest.NewFake(),
		sets:   ipsettest.NewFake(),
		binder: binder{ipvstest.NewBinder()},
		root:   t.TempDir(),
	}
	// iptables-restore fails on a rule that matches a set which does not
	// exist, as the kernel does.
	exists := func(name string) bool {
		_, err := f.sets.ListEntries(context.Background(), name)
		return err == nil
	}
	f.ipt4 = iptablestest.NewFake(iptablestest.WithIPSets(exists))
	f.ipt6 = iptablestest.NewIPv6Fake(iptablestest.WithIPSets(exists))
	for name, content := range map[string]string{
		"proc/sys/kernel/osrelease":                                   "6.1.0\n",
		"lib/modules/6.1.0/modules.builtin":                           "",
		"proc/modules":                                                "",
		"proc/sys/net/ipv4/conf/all/route_localnet":                   "0\n",
		"proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal":          "0\n",
		"proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established": "1\n",
		"proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait":  "1\n",
		"proc/sys/net/ipv4/ip_forward":                                "0\n",
		"proc/sys/net/ipv4/vs/conntrack":                              "0\n",
		"proc/sys/net/ipv4/vs/expire_nodest_conn":                     "0\n",
		"proc/sys/net/ipv4/vs/expire_quiescent_template":              "0\n",
		"proc/sys/net/ipv4/vs/conn_reuse_mode":                        "1\n",
	} {
		path := filepath.Join(f.root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return f, &Host{
		DetectBackend: func(context.Context) (iptables.Backend, error) { return iptables.BackendNFT, nil },
		NewIPTables: func(_ context.Context, p v1.IPFamily, _ iptables.Backend) (iptables.Interface, error) {
			if p == v1.IPv6Protocol {
				return f.ipt6, nil
			}
			return f.ipt4, nil
		},
		Kernel: &kernel.Kernel{Root: f.root},
		OpenIPVS: func(_ context.Context, table bool) (*ipvsmode.Handles, error) {
			k := &ipvsmode.Handles{Binder: f.binder, IPSets: f.sets}
			if table {
				k.IPVS = f.lb
			}
			return k, nil
		},
		NewNFTables: func(_ context.Context, family knftables.Family, table string) (knftables.Interface, error) {
			if f.nft[family] == nil {
				f.nft[family] = knftables.NewFake(family, table)
			}
			return f.nft[family], nil
		},
	}
}

// binder is the fake dummy-interface binder of a node without addresses.
type binder struct{ *ipvstest.Binder }

func (binder) HostAddresses(context.Context, string) ([]netip.Addr, error) { return nil, nil }

// withIPVS loads every module IPVS mode needs.
func (f *fakeHost) withIPVS(t *testing.T) {
	v, err := kernel.ParseVersion("6.1.0")
	if err != nil {
		t.Fatal(err)
	}
	var modules string
	for _, m := range append(kernel.RequiredIPVSModules(v), kernel.IPSetModules()...) {
		modules += m + " 16384 0 - Live 0x0000000000000000\n"
	}
	if err := os.WriteFile(filepath.Join(f.root, "proc/modules"), []byte(modules), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (f *fakeHost) sysctl(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.root, "proc/sys", name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// otherRules are another program's: they stay.
const otherRules = `*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A POSTROUTING -s 172.17.0.0/16 -j MASQUERADE
COMMIT
`

// TestCleanup: Cleanup removes the chains of iptables and IPVS mode of
// the Config's prefix and nftables mode's table, whatever the Config's
// mode, and leaves other programs' rules.
func TestCleanup(t *testing.T) {
	f, host := newFakeHost(t)
	if err := f.ipt4.ParseDump(otherRules); err != nil {
		t.Fatal(err)
	}
	// A first run in iptables mode, on the fakes.
	p, err := New(cluster(), "node-a", &Config{}, WithHost(host))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(f.ipt4.Dump(), "KUBE-SVC-") {
		t.Fatalf("iptables mode wrote no service chain:\n%s", f.ipt4.Dump())
	}
	nft, _ := host.NewNFTables(context.Background(), knftables.IPv4Family, "kube-proxy")
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{})
	if err := nft.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	if err := Cleanup(context.Background(), &Config{Mode: ModeNFTables}, WithHost(host)); err != nil {
		t.Fatal(err)
	}
	if d := f.ipt4.Dump(); strings.Contains(d, "KUBE-") || !strings.Contains(d, "-A POSTROUTING -s 172.17.0.0/16 -j MASQUERADE") {
		t.Errorf("after Cleanup, iptables holds the proxier's chains or lacks the other program's rule:\n%s", d)
	}
	if d := f.nft[knftables.IPv4Family].Dump(); d != "" {
		t.Errorf("nftables mode's table is left:\n%s", d)
	}
}

// TestInitNode: in iptables mode, InitNode tunes conntrack and sets
// route_localnet when node ports are served on 127.0.0.1, and writes none
// of the mode's rules.
func TestInitNode(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"localhost node ports", Config{LocalhostNodePorts: true}, "1"},
		{"primary addresses only", Config{LocalhostNodePorts: true, NodePortPrimary: true}, "0"},
		{"nftables mode", Config{Mode: ModeNFTables, LocalhostNodePorts: true}, "0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, host := newFakeHost(t)
			if err := f.ipt4.ParseDump(otherRules); err != nil {
				t.Fatal(err)
			}
			if err := InitNode(context.Background(), &tc.cfg, WithHost(host)); err != nil {
				t.Fatal(err)
			}
			if got := f.sysctl(t, "net/ipv4/conf/all/route_localnet"); got != tc.want {
				t.Errorf("route_localnet = %s, want %s", got, tc.want)
			}
			if got := f.sysctl(t, "net/netfilter/nf_conntrack_tcp_timeout_established"); got != "86400" {
				t.Errorf("nf_conntrack_tcp_timeout_established = %s, want kube-proxy's 86400", got)
			}
			if d := f.ipt4.Dump(); strings.Contains(d, "KUBE-") {
				t.Errorf("InitNode wrote rules:\n%s", d)
			}
		})
	}
}

// TestModeSwitch runs each mode after each other on one node of fakes:
// every mode finds the Service programmed its way, and nothing of the
// mode before it.
func TestModeSwitch(t *testing.T) {
	f, host := newFakeHost(t)
	f.withIPVS(t)
	ctx := context.Background()
	for _, mode := range []string{ModeIPTables, ModeIPVS, ModeNFTables, ModeIPTables, ModeNFTables, ModeIPVS, ModeIPTables} {
		p, err := New(cluster(), "node-a", &Config{Mode: mode}, WithHost(host))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.RunOnce(ctx); err != nil {
			t.Fatalf("%s mode: %v", mode, err)
		}
		nft := ""
		if f.nft[knftables.IPv4Family] != nil {
			nft = f.nft[knftables.IPv4Family].Dump()
		}
		got := map[string]bool{
			ModeIPTables: strings.Contains(f.ipt4.Dump(), "-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"default/web:http cluster IP\""),
			ModeIPVS:     strings.Contains(f.lb.Dump(), "TCP 10.96.0.10:80 rr"),
			ModeNFTables: strings.Contains(nft, "10.96.0.10 . tcp . 80"),
		}
		want := map[string]bool{ModeIPTables: mode == ModeIPTables, ModeIPVS: mode == ModeIPVS, ModeNFTables: mode == ModeNFTables}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("after a sync in %s mode, the modes that serve the Service (-want +got):\n%s\niptables:\n%s\nIPVS:\n%s\nnftables:\n%s", mode, diff, f.ipt4.Dump(), f.lb.Dump(), nft)
		}
		if mode != ModeIPVS && strings.Contains(f.sets.Dump(), "KUBE-") {
			t.Errorf("IPVS mode's sets are left in %s mode:\n%s", mode, f.sets.Dump())
		}
		if mode == ModeNFTables && strings.Contains(f.ipt4.Dump(), "KUBE-") {
			t.Errorf("the chains of iptables or IPVS mode are left in nftables mode:\n%s", f.ipt4.Dump())
		}
	}
}
