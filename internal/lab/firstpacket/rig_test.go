package firstpacket_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/testkit/clustertest"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/internal/testkit/ruleload"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxy"
)

// The network of every rig: the client outside the cluster CIDR (so its
// connections are masqueraded, by both writers alike), the node between
// it and the pods' bridge, and two pods, "first" and "last", that serve
// the endpoints of the service that sorts first and of the one that sorts
// last. The other services' endpoints (clustertest's 10.128.0.0/10) are
// addresses no namespace has; no connection goes to them.
const (
	nodeName    = "node-a"
	clientIP    = "10.1.0.2"
	nodeIP      = "10.1.0.1"
	bridgeIP    = "10.0.0.1"
	podCIDR     = "10.0.0.0/16"
	backendPort = 8080 // clustertest's endpoint port
	servicePort = 80   // clustertest's service port
	endpoints   = 10   // per service, as in the writers' benchmarks
)

// podAddrs returns the endpoint addresses a pod serves: ten addresses in
// 10.0.<third>.0/24.
func podAddrs(third int) []netip.Addr {
	var a []netip.Addr
	for i := range endpoints {
		a = append(a, netip.AddrFrom4([4]byte{10, 0, byte(third), byte(i + 1)}))
	}
	return a
}

var firstPodAddrs, lastPodAddrs = podAddrs(1), podAddrs(2)

// cluster is the input both writers render: clustertest.Cluster(n, 10),
// with the endpoints of the services that sort first and last replaced
// by the addresses of pods "first" and "last".
type cluster struct {
	n           int
	first, last types.NamespacedName
	// firstIP and lastIP are the two services' cluster IPs.
	firstIP, lastIP netip.Addr
	svcs            changetracker.ServicePortMap
	eps             changetracker.EndpointsMap
	svcRes          changetracker.UpdateServiceMapResult
	epRes           changetracker.UpdateEndpointsMapResult
}

// newCluster builds the cluster of n services. With n = 1 the first and
// the last service are the same, served by pod "last".
func newCluster(t testing.TB, n int) *cluster {
	t.Helper()
	objs := clustertest.Cluster(n, endpoints)
	var names []types.NamespacedName
	ips := map[types.NamespacedName]netip.Addr{}
	for _, o := range objs {
		if svc, ok := o.(*v1.Service); ok {
			nn := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
			names = append(names, nn)
			ips[nn] = netip.MustParseAddr(svc.Spec.ClusterIP)
		}
	}
	// The iptables writer orders KUBE-SERVICES by namespace, then name
	// (TestFirstPacketReach checks that it still does).
	slices.SortFunc(names, func(a, b types.NamespacedName) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	c := &cluster{n: n, first: names[0], last: names[len(names)-1]}
	c.firstIP, c.lastIP = ips[c.first], ips[c.last]

	quiet := changetracker.WithLogger(klog.Background().V(10))
	st := changetracker.NewServiceChangeTracker(v1.IPv4Protocol, nil, quiet)
	et := changetracker.NewEndpointsChangeTracker(v1.IPv4Protocol, nodeName, nil, quiet)
	for _, o := range objs {
		switch o := o.(type) {
		case *v1.Service:
			st.Update(nil, o)
		case *discoveryv1.EndpointSlice:
			nn := types.NamespacedName{Namespace: o.Namespace, Name: o.Labels[discoveryv1.LabelServiceName]}
			switch nn {
			case c.last:
				setAddrs(o, lastPodAddrs)
			case c.first:
				setAddrs(o, firstPodAddrs)
			}
			et.EndpointSliceUpdate(o, false)
		}
	}
	c.svcs, c.eps = changetracker.ServicePortMap{}, changetracker.EndpointsMap{}
	c.svcRes, c.epRes = c.svcs.Update(st), c.eps.Update(et)
	if len(c.svcs) != n {
		t.Fatalf("cluster of %d services: the tracker holds %d service ports", n, len(c.svcs))
	}
	return c
}

func setAddrs(s *discoveryv1.EndpointSlice, addrs []netip.Addr) {
	for i := range s.Endpoints {
		s.Endpoints[i].Addresses = []string{addrs[i%len(addrs)].String()}
	}
}

// writerKind names the rules under test.
type writerKind string

const (
	kindNFTables       writerKind = "nftables"
	kindIPTablesLegacy writerKind = "iptables-legacy"
	kindIPTablesNFT    writerKind = "iptables-nft"
)

var allKinds = []writerKind{kindNFTables, kindIPTablesLegacy, kindIPTablesNFT}

// tools returns the binaries a kind needs.
func (k writerKind) tools() []string {
	switch k {
	case kindNFTables:
		return []string{"nft"}
	case kindIPTablesLegacy:
		return []string{"iptables-legacy", "iptables-legacy-save", "iptables-legacy-restore"}
	default:
		return []string{"iptables-nft", "iptables-nft-save", "iptables-nft-restore"}
	}
}

// rig is one writer's rules loaded into its own network's node namespace.
type rig struct {
	kind writerKind
	nw   *kerneltest.ProxyNetwork
	ipt  iptables.Interface // iptables kinds only
	// load is how long applying the full sync took (nft -f, or
	// iptables-restore with the jump rules ensured first).
	load time.Duration
}

// newRig builds a network and applies the writer's full sync of c in its
// node namespace. Call kerneltest.Require(t, kind.tools()...) first.
func newRig(t testing.TB, kind writerKind, c *cluster) *rig {
	t.Helper()
	r := &rig{kind: kind, nw: kerneltest.NewProxyNetwork(t, kerneltest.ProxyNetworkConfig{
		ClientAddrs: []netip.Prefix{netip.PrefixFrom(netip.MustParseAddr(clientIP), 24)},
		NodeAddrs:   []netip.Prefix{netip.PrefixFrom(netip.MustParseAddr(nodeIP), 24)},
		BridgeAddrs: []netip.Prefix{netip.PrefixFrom(netip.MustParseAddr(bridgeIP), 16)},
		Pods:        []kerneltest.NetworkPod{{Name: "first", Addrs: prefixes(firstPodAddrs)}, {Name: "last", Addrs: prefixes(lastPodAddrs)}},
		BackendPort: backendPort,
	})}
	// The client makes tens of thousands of connections to one address
	// and port; give it every port.
	r.nw.Client.Sysctl(t, "net.ipv4.ip_local_port_range", "1024 65535")
	var err error
	switch kind {
	case kindNFTables:
		r.load, err = ruleload.NFTables(r.nw.Node, node(), c.input())
	case kindIPTablesLegacy:
		r.ipt, r.load, err = ruleload.IPTables(r.nw.Node, iptables.BackendLegacy, t.TempDir()+"/xtables.lock", node(), c.input())
	default:
		r.ipt, r.load, err = ruleload.IPTables(r.nw.Node, iptables.BackendNFT, t.TempDir()+"/xtables.lock", node(), c.input())
	}
	if err != nil {
		t.Fatalf("%s: loading %d services: %v", kind, c.n, err)
	}
	return r
}

func prefixes(addrs []netip.Addr) []netip.Prefix {
	var p []netip.Prefix
	for _, a := range addrs {
		p = append(p, netip.PrefixFrom(a, 16))
	}
	return p
}

// input is the writers' input of c.
func (c *cluster) input() *proxy.FamilyInput {
	return &proxy.FamilyInput{Services: c.svcs, Endpoints: c.eps, ServiceChanges: c.svcRes, EndpointChanges: c.epRes, NodeIPs: []netip.Addr{netip.MustParseAddr(nodeIP)}}
}

// node is the node the writers are given.
func node() proxy.NodeConfig {
	return proxy.NodeConfig{Name: nodeName, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(podCIDR)}}
}

// serviceOrder returns the cluster IPs of the nat table's KUBE-SERVICES
// rules in the order a new connection is matched against them.
func (r *rig) serviceOrder() ([]netip.Addr, error) {
	return ruleload.ServiceOrder(r.nw.Node, r.ipt)
}

// serviceElements returns how many elements the nftables writer's
// service-ips verdict map holds for TCP port 80.
func (r *rig) serviceElements() (int, error) {
	out, err := r.nw.Node.Exec("nft", "list", "map", "ip", nftables.DefaultTableName, "service-ips")
	if err != nil {
		return 0, err
	}
	return strings.Count(out, fmt.Sprintf(" . tcp . %d : ", servicePort)), nil
}

// connect makes count new TCP connections from the client to each of
// dsts, one after another, alternating between dsts in batches of batch
// connections so that a change in the machine's load falls on all of them
// alike. It returns, for each of dsts, how many each backend answered and
// how long its connections took in all. Each connection reads the
// backend's one-line reply and closes with a reset, so that no end keeps
// it in TIME_WAIT and a later connection reusing the ports is not held
// up; the node's conntrack entry then lasts the few seconds of a closed
// connection. It stops at the first connection that fails, each bounded
// by a 3 s timeout.
func connect(ns *kerneltest.NS, dsts []netip.AddrPort, count, batch int) ([]map[string]int, []time.Duration, error) {
	seen := make([]map[string]int, len(dsts))
	for i := range seen {
		seen[i] = map[string]int{}
	}
	took := make([]time.Duration, len(dsts))
	err := ns.Do(func() error {
		d := net.Dialer{Timeout: 3 * time.Second}
		buf := make([]byte, 128)
		for done := 0; done < count; done += batch {
			for i, dst := range dsts {
				start := time.Now()
				for k := done; k < min(done+batch, count); k++ {
					name, err := once(&d, dst, buf)
					if err != nil {
						return fmt.Errorf("connection %d of %d to %s: %w", k+1, count, dst, err)
					}
					seen[i][name]++
				}
				took[i] += time.Since(start)
			}
		}
		return nil
	})
	return seen, took, err
}

// once makes one connection and returns the name of the backend that
// answered.
func once(d *net.Dialer, dst netip.AddrPort, buf []byte) (string, error) {
	conn, err := d.Dial("tcp", dst.String())
	if err != nil {
		return "", err
	}
	tc := conn.(*net.TCPConn)
	defer tc.Close()
	_ = tc.SetLinger(0)
	if err := tc.SetDeadline(time.Now().Add(3 * time.Second)); err != nil {
		return "", err
	}
	n := 0
	for {
		m, err := tc.Read(buf[n:])
		n += m
		if i := bytes.IndexByte(buf[:n], '\n'); i >= 0 {
			name, _, ok := bytes.Cut(buf[:i], []byte(" "))
			if !ok {
				return "", fmt.Errorf("malformed reply %q", buf[:i])
			}
			return string(name), nil
		}
		if errors.Is(err, io.EOF) || n == len(buf) {
			return "", fmt.Errorf("reply without a newline: %q", buf[:n])
		}
		if err != nil {
			return "", err
		}
	}
}
