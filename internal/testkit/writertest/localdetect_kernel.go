package writertest

import (
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/proxy"
)

// KernelNetwork returns a dual-stack network for the writers' kernel
// tests (LocalDetectionKernel's among them): a client (10.1.0.2,
// fd01::2) on one link of the node (10.1.0.1, fd01::1), and pods pod-a
// and pod-b (10.0.0.11 and .12, fd00:10::11 and ::12) on its bridge br0
// (10.0.0.1/16, fd00:10::1/64), with backends on port 8080. Call
// kerneltest.Require first.
func KernelNetwork(t *testing.T) *kerneltest.ProxyNetwork {
	p := netip.MustParsePrefix
	return kerneltest.NewProxyNetwork(t, kerneltest.ProxyNetworkConfig{
		ClientAddrs: []netip.Prefix{p("10.1.0.2/24"), p("fd01::2/64")},
		NodeAddrs:   []netip.Prefix{p("10.1.0.1/24"), p("fd01::1/64")},
		BridgeAddrs: []netip.Prefix{p("10.0.0.1/16"), p("fd00:10::1/64")},
		Pods: []kerneltest.NetworkPod{
			{Name: "pod-a", Addrs: []netip.Prefix{p("10.0.0.11/16"), p("fd00:10::11/64")}},
			{Name: "pod-b", Addrs: []netip.Prefix{p("10.0.0.12/16"), p("fd00:10::12/64")}},
		},
		BackendPort: 8080,
	})
}

// LocalSync renders c's pending changes with the writer of one
// LocalDetectionKernel case and applies them in the node's namespace,
// failing t if the kernel refuses them or the sync's fullness is not
// wantFull.
type LocalSync func(t *testing.T, c *Cluster, wantFull bool)

// LocalDetectionKernel checks, with real packets in nw
// (KernelNetwork), what each local-detection mode tells apart, in
// family: a connection to a cluster IP whose endpoint is pod-b keeps its
// source when it is local and is masqueraded (pod-b sees the bridge's
// address) when it is not; a local one to the VIP of an
// externalTrafficPolicy Local service whose only endpoint is on another
// node reaches it (pod traffic is short-circuited to all endpoints),
// another is dropped. The local clients are pod-a (behind br0, inside
// 10.0.0.0/24) and, in NodeCIDR mode once the pod range moves to the
// client's, the client. newWriter makes a writer for node in nw's node
// namespace and returns how to sync it; every case starts with a new one.
func LocalDetectionKernel(t *testing.T, nw *kerneltest.ProxyNetwork, family v1.IPFamily, newWriter func(t *testing.T, node proxy.NodeConfig) LocalSync) {
	v6 := family == v1.IPv6Protocol
	a := func(v4, v6addr string) netip.Addr {
		if v6 {
			return netip.MustParseAddr(v6addr)
		}
		return netip.MustParseAddr(v4)
	}
	pr := func(v4, v6p string) []netip.Prefix {
		if v6 {
			return []netip.Prefix{netip.MustParsePrefix(v6p)}
		}
		return []netip.Prefix{netip.MustParsePrefix(v4)}
	}
	var (
		nodeIP    = a("10.1.0.1", "fd01::1")
		bridgeIP  = a("10.0.0.1", "fd00:10::1")
		podA      = a("10.0.0.11", "fd00:10::11")
		podB      = a("10.0.0.12", "fd00:10::12")
		clientIP  = a("10.1.0.2", "fd01::2")
		clusterIP = a("10.96.0.60", "fd00:96::60")
		lbSvcIP   = a("10.96.0.61", "fd00:96::61")
		vip       = a("203.0.113.60", "2001:db8:3::60")
		podRange  = pr("10.0.0.0/24", "fd00:10::/64")
		clientNet = pr("10.1.0.0/24", "fd01::/64")
	)
	type client struct {
		name string
		ns   *kerneltest.NS
		addr netip.Addr
	}
	pod := client{"pod-a", nw.Pods["pod-a"], podA}
	outside := client{"the client", nw.Client, clientIP}
	// expect checks what local (nil: nobody) and others see.
	expect := func(t *testing.T, step string, local *client, others ...client) {
		t.Helper()
		check := func(cl client, isLocal bool) {
			t.Helper()
			svc := netip.AddrPortFrom(clusterIP, 80)
			r, err := kerneltest.Dial(cl.ns, "tcp", svc, 3*time.Second)
			want := bridgeIP
			if isLocal {
				want = cl.addr
			}
			if err != nil || r.Name != "pod-b" || r.Client != want {
				t.Errorf("%s: %s to %s: reply %+v, error %v; want pod-b seeing %s (local %v)", step, cl.name, svc, r, err, want, isLocal)
			}
			lb := netip.AddrPortFrom(vip, 80)
			r, err = kerneltest.Dial(cl.ns, "tcp", lb, time.Second)
			switch {
			case isLocal && (err != nil || r.Name != "pod-b"):
				t.Errorf("%s: %s to %s: reply %+v, error %v; want pod-b (local traffic short-circuited to every endpoint)", step, cl.name, lb, r, err)
			case !isLocal && !kerneltest.IsTimeout(err):
				t.Errorf("%s: %s to %s: reply %+v, error %v; want a timeout (no local endpoint: dropped)", step, cl.name, lb, r, err)
			}
		}
		if local != nil {
			check(*local, true)
		}
		for _, cl := range others {
			check(cl, false)
		}
	}

	newCluster := func() *Cluster {
		c := NewCluster(family, Node)
		c.NodeIPs = []netip.Addr{nodeIP}
		c.SetService(Service("ns", "web", clusterIP.String()))
		c.SetEndpoints("ns", "web", TCP8080, remote(podB.String()))
		c.SetService(Service("ns", "lb", lbSvcIP.String(), WithLoadBalancer(vip.String()), WithNodePort(31060), WithExternalLocal(), WithHealthCheckNodePort(32060)))
		c.SetEndpoints("ns", "lb", TCP8080, remote(podB.String()))
		return c
	}
	t.Run("BridgeInterface", func(t *testing.T) {
		sync := newWriter(t, proxy.NodeConfig{Name: Node, DetectLocalMode: proxy.LocalModeBridgeInterface, BridgeInterface: "br0"})
		sync(t, newCluster(), true)
		expect(t, "bridge br0", &pod, outside)
	})
	t.Run("InterfaceNamePrefix", func(t *testing.T) {
		sync := newWriter(t, proxy.NodeConfig{Name: Node, DetectLocalMode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: "br"})
		sync(t, newCluster(), true)
		expect(t, "prefix br", &pod, outside)
	})
	t.Run("NodeCIDR", func(t *testing.T) {
		// The cluster CIDR holds both clients: NodeCIDR mode must not
		// read it.
		sync := newWriter(t, proxy.NodeConfig{Name: Node, DetectLocalMode: proxy.LocalModeNodeCIDR,
			ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/7")}})
		c := newCluster()
		sync(t, c, true)
		// Until the node has a pod range nothing is local, and nothing
		// is masqueraded for being from elsewhere either.
		r, err := kerneltest.Dial(outside.ns, "tcp", netip.AddrPortFrom(clusterIP, 80), 3*time.Second)
		if err != nil || r.Client != clientIP {
			t.Errorf("no pod CIDR: the client to the cluster IP: reply %+v, error %v; want pod-b seeing %s (no local detection)", r, err, clientIP)
		}
		c.PodCIDRs = podRange
		sync(t, c, true)
		expect(t, "pod range "+podRange[0].String(), &pod, outside)
		c.PodCIDRs = clientNet
		sync(t, c, true)
		expect(t, "pod range "+clientNet[0].String(), &outside, pod)
	})
}
