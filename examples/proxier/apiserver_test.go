package main

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/proxykit/proxykit/internal/testkit/apiservertest"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/proxier/config"
)

// The API server tests run the built proxier with --kubeconfig against a
// real kube-apiserver and etcd (internal/testkit/apiservertest), in a control-plane
// namespace beside the end-to-end tests' node:
//
//	client ── node (proxier) ── br0 ── pods (as in e2e_test.go)
//	           10.2.0.1
//	              │
//	           control plane: kube-apiserver 10.2.0.2:6443 (the proxier's),
//	                          kube-apiserver 10.2.0.3:6443 (the test's, when two),
//	                          etcd on its loopback
//
// The test writes Services, EndpointSlices and the Node with a real
// clientset (no controller-manager: slices are written directly, as the
// EndpointSlice controller would), so the proxier meets what only a real
// server does: server-side label and field selectors, validation,
// resource versions, watches that end, 410 Gone and relists.
const (
	apiNodeAddr = "10.2.0.1"
	// apiNodeIP6 and apiClientIP6 are the node's and the client's IPv6
	// addresses on a dual-stack e2eNode.
	apiNodeIP6   = "fd00:1::1"
	apiClientIP6 = "fd00:1::2"
	// apiChange bounds the time from a write to traffic following it with
	// a healthy API server; apiRecovery from the end of a fault to traffic
	// following what changed during it, which includes client-go's
	// reconnection backoff: it doubles from 0.8s after each failure and
	// stops in [30s, 60s), and only resets after two quiet minutes.
	apiChange   = 10 * time.Second
	apiRecovery = 90 * time.Second
)

// apiServerAddr is the address of the i-th API server.
func apiServerAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 2, 0, byte(2 + i)})
}

// apiNode is an e2eNode whose proxier watches a real API server.
type apiNode struct {
	*e2eNode
	cp      *kerneltest.NS
	cluster *apiservertest.Cluster
	// kube writes through the last API server; the proxier watches the
	// first, so with two the test can write while the proxier's is down.
	kube kubernetes.Interface
	ctx  context.Context
}

// newAPINode builds the network and the control plane, with servers API
// servers, and writes the namespace and the Node (zone-a, address
// 10.1.0.1, and fd00:1::1 with ipv6). The proxier is not started.
func newAPINode(t *testing.T, servers int, cfg apiservertest.Config, ipv6 bool) *apiNode {
	t.Helper()
	backend := iptables.BackendNFT
	tools := append(e2eTools(backend), "ss")
	if ipv6 {
		tools = append(tools, "ip6tables-nft", "ip6tables-nft-save", "ip6tables-nft-restore")
	}
	bin := apiservertest.Require(t, tools...)
	k := &apiNode{e2eNode: newE2ENode(t, backend, &e2eCluster{}, ipv6), ctx: context.Background()}
	k.cp = kerneltest.NewNS(t)
	v := kerneltest.Link(t, k.node, k.cp, prefix(apiNodeAddr+"/24"), netip.Prefix{})
	for i := range servers {
		k.cp.AddAddr(t, v.B, netip.PrefixFrom(apiServerAddr(i), 24))
		cfg.APIServers = append(cfg.APIServers, apiServerAddr(i))
	}
	start := time.Now()
	k.cluster = apiservertest.Start(t, k.cp, bin, cfg)
	t.Logf("control plane (%d API servers) ready in %v", servers, time.Since(start).Round(time.Millisecond))
	k.kube = k.cluster.APIServer(servers - 1).Client()
	if _, err := k.kube.CoreV1().Namespaces().Create(k.ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e2eNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: "zone-a"}},
		Status:     v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: e2eNodeIP}}},
	}
	if ipv6 {
		node.Status.Addresses = append(node.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: apiNodeIP6})
	}
	if _, err := k.kube.CoreV1().Nodes().Create(k.ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return k
}

// startProxier runs the proxier against the first API server, as the
// user system:kube-proxy, and waits for its first sync. At -v 4 its log
// shows client-go's watch endings, which the fault tests look for.
func (k *apiNode) startProxier(t *testing.T, extra ...string) {
	t.Helper()
	k.start(append([]string{"--kubeconfig", k.cluster.APIServer(0).Kubeconfig(t), "--hostname-override", "node-a", "--cluster-cidr", e2eClusterCIDR,
		"--sync-period", e2eSyncPeriod.String(), "--min-sync-period", "100ms", "--iptables-drift-check-period", "0",
		"--healthz-bind-address", e2eNodeIP + ":10256", "--metrics-bind-address", e2eNodeIP + ":10249", "-v", "4"}, extra...)...)
}

// converge waits until check passes, within timeout, and logs how long
// that took since from.
func (k *apiNode) converge(t *testing.T, timeout time.Duration, what string, from time.Time, check func() error) time.Duration {
	t.Helper()
	k.eventually(timeout, what, check)
	d := time.Since(from)
	t.Logf("converged: %s in %v", what, d.Round(10*time.Millisecond))
	return d
}

// reach is e2eNode.reaches with a short dial timeout: on a veth a
// connection that works is made in well under a millisecond, and a SYN
// sent before the rules were there stays untranslated for its whole
// connection, so a long timeout would only blur the convergence times.
func (k *apiNode) reach(network, to string, port, n int, want ...string) error {
	from := e2eClientIP
	if netip.MustParseAddr(to).Is6() {
		from = apiClientIP6
	}
	got := map[string]int{}
	for range n {
		r, err := k.dial(network, from, to, port, 300*time.Millisecond)
		if err != nil {
			return err
		}
		got[r.Name]++
	}
	names := slices.Sorted(maps.Keys(got))
	slices.Sort(want)
	if !slices.Equal(names, want) {
		return fmt.Errorf("%s to %s:%d: %d connections reached %v, want each of %v", network, to, port, n, got, want)
	}
	return nil
}

// apiService is a Service of e2eNS with one TCP port, 80 to 8080, named
// http; a clusterIP of "None" makes it headless.
func apiService(name, clusterIP string, edit ...func(*v1.Service)) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e2eNS},
		Spec: v1.ServiceSpec{
			ClusterIP: clusterIP,
			Ports:     []v1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(e2ePodPort), Protocol: v1.ProtocolTCP}},
		},
	}
	for _, e := range edit {
		e(svc)
	}
	return svc
}

// apiSlice is an IPv4 EndpointSlice of service named name-1, port http
// 8080/TCP, with a ready endpoint for each pod.
func apiSlice(service string, pods ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: service + "-1", Namespace: e2eNS,
			Labels: map[string]string{discoveryv1.LabelServiceName: service},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(int32(e2ePodPort)), Protocol: new(v1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{},
	}
	for _, name := range pods {
		for _, p := range e2ePods {
			if p.name == name {
				s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
					Addresses:  []string{p.ip},
					NodeName:   new(p.node),
					Conditions: discoveryv1.EndpointConditions{Ready: new(true)},
				})
			}
		}
	}
	return s
}

// apiSlice6 is apiSlice's IPv6 twin, named service-6.
func apiSlice6(service string, pods ...string) *discoveryv1.EndpointSlice {
	s := apiSlice(service, pods...)
	s.Name, s.AddressType = service+"-6", discoveryv1.AddressTypeIPv6
	for i := range s.Endpoints {
		for _, p := range e2ePods {
			if p.ip == s.Endpoints[i].Addresses[0] {
				s.Endpoints[i].Addresses = []string{p.ip6}
			}
		}
	}
	return s
}

// createService creates svc and returns it as the API server stored it,
// with the addresses and ports it allocated.
func (k *apiNode) createService(t *testing.T, svc *v1.Service) *v1.Service {
	t.Helper()
	created, err := k.kube.CoreV1().Services(e2eNS).Create(k.ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Service %s: %v", svc.Name, err)
	}
	return created
}

// putSlice creates the slice, or replaces the one of its name.
func (k *apiNode) putSlice(t *testing.T, s *discoveryv1.EndpointSlice) {
	t.Helper()
	slices := k.kube.DiscoveryV1().EndpointSlices(e2eNS)
	_, err := slices.Create(k.ctx, s, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		var old *discoveryv1.EndpointSlice
		if old, err = slices.Get(k.ctx, s.Name, metav1.GetOptions{}); err == nil {
			s.ResourceVersion = old.ResourceVersion
			_, err = slices.Update(k.ctx, s, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		t.Fatalf("writing EndpointSlice %s: %v", s.Name, err)
	}
}

// editService reads the Service, applies edit and writes it back.
func (k *apiNode) editService(t *testing.T, name string, edit func(*v1.Service)) {
	t.Helper()
	svc, err := k.kube.CoreV1().Services(e2eNS).Get(k.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	edit(svc)
	if _, err := k.kube.CoreV1().Services(e2eNS).Update(k.ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("updating Service %s: %v", name, err)
	}
}

// hasRules reports whether the node's nat table mentions the service port
// name ns/name:port.
func (k *apiNode) hasRules(t *testing.T, svc string) bool {
	t.Helper()
	return strings.Contains(k.iptables(t, v1.IPv4Protocol, "-t", "nat", "-S"), `"`+e2eNS+"/"+svc+":http")
}

// TestAPIServerServices runs the proxier against a real API server through
// every kind of object the server hands it, and the ones it refuses.
func TestAPIServerServices(t *testing.T) {
	k := newAPINode(t, 1, apiservertest.Config{}, false)
	k.startProxier(t)

	t.Run("kubernetes Service", func(t *testing.T) {
		// The API server publishes itself as default/kubernetes, on the
		// first address of the service range: the proxier forwards it to
		// the API server's own address.
		k.eventually(apiChange, "default/kubernetes forwarded", func() error {
			var c net.Conn
			err := k.client.Do(func() (err error) {
				c, err = net.DialTimeout("tcp", "10.96.0.1:443", time.Second)
				return err
			})
			if err == nil {
				c.Close()
			}
			return err
		})
	})

	t.Run("client-go's metrics", func(t *testing.T) {
		// The proxier's own requests (its lists and watches) are on its
		// /metrics under kube-proxy's names and labels, and so is the
		// transport it made, registered before the client was built.
		host := k.cluster.APIServer(0).Addr.String()
		// The informers' lists and watches go through client-go's Watch,
		// which counts results but times nothing: the latency and size
		// histograms fill from other requests.
		want := []string{
			`rest_client_requests_total{code="200",host="` + host + `",method="GET"}`,
			`rest_client_transport_create_calls_total{result=`,
		}
		k.eventually(apiChange, "rest_client_ metrics", func() error {
			m, err := scrape(k.get, "http://"+e2eNodeIP+":10249/metrics")
			if err != nil {
				return err
			}
			for _, w := range want {
				found := false
				for name, v := range m {
					found = found || strings.HasPrefix(name, w) && v > 0
				}
				if !found {
					var have []string
					for name := range m {
						if strings.HasPrefix(name, "rest_client_") {
							have = append(have, name)
						}
					}
					return fmt.Errorf("no sample %s... above 0; have %q", w, have)
				}
			}
			return nil
		})
	})

	t.Run("ClusterIP and NodePort", func(t *testing.T) {
		start := time.Now()
		k.createService(t, apiService("web", "10.96.0.10"))
		k.putSlice(t, apiSlice("web", "pod-a", "pod-b"))
		k.createService(t, apiService("np", "10.96.0.11", func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30080
		}))
		k.putSlice(t, apiSlice("np", "pod-b", "pod-c"))
		k.converge(t, apiChange, "ClusterIP Service", start, func() error { return k.reach("tcp", "10.96.0.10", 80, 30, "pod-a", "pod-b") })
		k.converge(t, apiChange, "NodePort Service", start, func() error { return k.reach("tcp", e2eNodeIP, 30080, 30, "pod-b", "pod-c") })
		check(t, k.reach("tcp", "10.96.0.11", 80, 30, "pod-b", "pod-c"))
	})

	t.Run("slices before the Service", func(t *testing.T) {
		k.putSlice(t, apiSlice("early", "pod-c"))
		// Give the slice time to reach the proxier: nothing may come of
		// it without its Service.
		time.Sleep(time.Second)
		if k.hasRules(t, "early") {
			t.Fatal("rules for early before its Service exists")
		}
		start := time.Now()
		k.createService(t, apiService("early", "10.96.0.12"))
		k.converge(t, apiChange, "Service after its slices", start, func() error { return k.reach("tcp", "10.96.0.12", 80, 20, "pod-c") })
	})

	t.Run("churn", func(t *testing.T) {
		start := time.Now()
		k.putSlice(t, apiSlice("web", "pod-a"))
		k.converge(t, apiChange, "scale down", start, func() error { return k.reach("tcp", "10.96.0.10", 80, 20, "pod-a") })
		start = time.Now()
		k.putSlice(t, apiSlice("web", "pod-a", "pod-b", "pod-c"))
		k.converge(t, apiChange, "scale up", start, func() error { return k.reach("tcp", "10.96.0.10", 80, 40, "pod-a", "pod-b", "pod-c") })
		// Many writes in a burst: the proxier ends where the last one
		// left it.
		start = time.Now()
		for i := range 20 {
			k.putSlice(t, apiSlice("web", e2ePods[i%3].name))
		}
		k.converge(t, apiChange, "20 writes in a burst", start, func() error { return k.reach("tcp", "10.96.0.10", 80, 20, e2ePods[19%3].name) })
		start = time.Now()
		if err := k.kube.CoreV1().Services(e2eNS).Delete(k.ctx, "np", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		k.converge(t, apiChange, "Service deleted", start, func() error {
			if err := k.refused("tcp", e2eClientIP, e2eNodeIP, 30080); err != nil {
				return err
			}
			return k.unanswered("tcp", e2eClientIP, "10.96.0.11", 80)
		})
	})

	t.Run("service-proxy-name", func(t *testing.T) {
		// Another proxier's Service: the server-side label selector
		// keeps it from this one, until the label goes, and again when
		// it comes back.
		other := func(s *v1.Service) { s.Labels = map[string]string{config.ServiceProxyNameLabel: "someone-else"} }
		k.createService(t, apiService("other", "10.96.0.13", other))
		k.putSlice(t, apiSlice("other", "pod-a"))
		k.putSlice(t, apiSlice("web", "pod-b")) // a change the proxier does see
		k.eventually(apiChange, "a change after other's", func() error { return k.reach("tcp", "10.96.0.10", 80, 10, "pod-b") })
		check(t, k.unanswered("tcp", e2eClientIP, "10.96.0.13", 80))
		if k.hasRules(t, "other") {
			t.Error("rules for a Service of another proxier")
		}
		start := time.Now()
		k.editService(t, "other", func(s *v1.Service) { delete(s.Labels, config.ServiceProxyNameLabel) })
		k.converge(t, apiChange, "label removed", start, func() error { return k.reach("tcp", "10.96.0.13", 80, 10, "pod-a") })
		start = time.Now()
		k.editService(t, "other", other)
		k.converge(t, apiChange, "label put back", start, func() error { return k.unanswered("tcp", e2eClientIP, "10.96.0.13", 80) })
	})

	t.Run("headless", func(t *testing.T) {
		// The slice has the label the EndpointSlice controller gives the
		// slices of a headless Service; with it, the server-side
		// selectors keep both from the proxier.
		k.createService(t, apiService("headless", v1.ClusterIPNone))
		hs := apiSlice("headless", "pod-a")
		hs.Labels[v1.IsHeadlessService] = ""
		k.putSlice(t, hs)
		k.putSlice(t, apiSlice("web", "pod-c"))
		k.eventually(apiChange, "a change after headless's", func() error { return k.reach("tcp", "10.96.0.10", 80, 10, "pod-c") })
		if k.hasRules(t, "headless") {
			t.Error("rules for a headless Service")
		}
		if strings.Contains(k.log.String(), "headless") {
			t.Errorf("the server's selectors should keep the headless Service and its slice from the proxier, which logged them:\n%s", grepLines(k.log.String(), "headless"))
		}
	})

	t.Run("node topology", func(t *testing.T) {
		// Zone hints: pod-a for zone-a, pod-b for zone-b. The node's
		// zone, changed through the API, picks the endpoints.
		s := apiSlice("zoned", "pod-a", "pod-b")
		for i, zone := range []string{"zone-a", "zone-b"} {
			s.Endpoints[i].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}}
		}
		k.createService(t, apiService("zoned", "10.96.0.14"))
		k.putSlice(t, s)
		k.eventually(apiChange, "zone-a's endpoint", func() error { return k.reach("tcp", "10.96.0.14", 80, 20, "pod-a") })
		start := time.Now()
		node, err := k.kube.CoreV1().Nodes().Get(k.ctx, "node-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Labels[v1.LabelTopologyZone] = "zone-b"
		if _, err := k.kube.CoreV1().Nodes().Update(k.ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		k.converge(t, apiChange, "node moved to zone-b", start, func() error { return k.reach("tcp", "10.96.0.14", 80, 20, "pod-b") })
	})

	t.Run("refused by the API server", func(t *testing.T) {
		// What the server refuses never reaches the proxier: each write
		// fails as Invalid, and the proxier never logs the object.
		bad := map[string]error{}
		_, bad["loopback external IP"] = k.kube.CoreV1().Services(e2eNS).Create(k.ctx, apiService("refused-ext", "10.96.0.15",
			func(s *v1.Service) { s.Spec.ExternalIPs = []string{"127.0.0.1"} }), metav1.CreateOptions{})
		_, bad["port name"] = k.kube.CoreV1().Services(e2eNS).Create(k.ctx, apiService("refused-port", "10.96.0.16",
			func(s *v1.Service) { s.Spec.Ports[0].Name = "Not_A_Label" }), metav1.CreateOptions{})
		loop := apiSlice("refused-slice", "pod-a")
		loop.Endpoints[0].Addresses = []string{"127.0.0.1"}
		_, bad["loopback endpoint"] = k.kube.DiscoveryV1().EndpointSlices(e2eNS).Create(k.ctx, loop, metav1.CreateOptions{})
		linkLocal := apiSlice("refused-slice", "pod-a")
		linkLocal.Endpoints[0].Addresses = []string{"169.254.0.7"}
		_, bad["link-local endpoint"] = k.kube.DiscoveryV1().EndpointSlices(e2eNS).Create(k.ctx, linkLocal, metav1.CreateOptions{})
		for what, err := range bad {
			if !apierrors.IsInvalid(err) {
				t.Errorf("%s: the API server answered %v, want Invalid", what, err)
			}
		}
		k.putSlice(t, apiSlice("web", "pod-a"))
		k.eventually(apiChange, "a change after the refused ones", func() error { return k.reach("tcp", "10.96.0.10", 80, 10, "pod-a") })
		if strings.Contains(k.log.String(), "refused-") {
			t.Errorf("the proxier saw objects the API server refused:\n%s", grepLines(k.log.String(), "refused-"))
		}
	})

	t.Run("accepted by the API server, refused by the proxier", func(t *testing.T) {
		// The API server lets a multicast address through as an endpoint
		// and as an external IP (it refuses only link-local multicast);
		// no DNAT may lead there. The proxier skips that address alone.
		k.createService(t, apiService("mixed", "10.96.0.17", func(s *v1.Service) { s.Spec.ExternalIPs = []string{"239.1.2.4", "192.0.2.20"} }))
		s := apiSlice("mixed", "pod-a", "pod-b")
		s.Endpoints[1].Addresses = []string{"239.1.2.3"}
		k.putSlice(t, s)
		k.eventually(apiChange, "the good endpoint and external IP", func() error {
			if err := k.reach("tcp", "10.96.0.17", 80, 20, "pod-a"); err != nil {
				return err
			}
			return k.reach("tcp", "192.0.2.20", 80, 10, "pod-a")
		})
		log := k.log.String()
		for msg, want := range map[string]string{
			"Ignoring endpoint that cannot be a backend": `endpointSlice="e2e/mixed-1" address="239.1.2.3" reason="multicast address"`,
			"Ignoring invalid external IP":               `service="e2e/mixed" externalIP="239.1.2.4" reason="multicast address"`,
		} {
			if lines := grepLines(log, `"`+msg+`"`); !strings.Contains(lines, want) {
				t.Errorf("the proxier's log has no %q with %s; it has:\n%s", msg, want, lines)
			}
		}
		if strings.Contains(k.iptables(t, v1.IPv4Protocol, "-t", "nat", "-S"), "239.1.2.") {
			t.Error("a rule mentions a multicast address")
		}
		check(t, k.reach("tcp", "10.96.0.10", 80, 10, "pod-a"))
	})
}

// TestAPIServerDualStack runs a dual-stack cluster: the API server
// allocates a NodePort Service a cluster IP of each family and one node
// port, and the proxier serves each family from the slice of that family.
func TestAPIServerDualStack(t *testing.T) {
	k := newAPINode(t, 1, apiservertest.Config{ServiceCIDRs: []netip.Prefix{prefix("10.96.0.0/16"), prefix("fd00:96::/112")}}, true)
	k.startProxier(t, "--cluster-cidr", e2eClusterCIDR+",fd00:244::/64")
	policy := v1.IPFamilyPolicyRequireDualStack
	svc := k.createService(t, apiService("dual", "", func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.IPFamilyPolicy = &policy
		s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
	}))
	if len(svc.Spec.ClusterIPs) != 2 || svc.Spec.Ports[0].NodePort == 0 {
		t.Fatalf("the API server allocated cluster IPs %v and node port %d, want one IP of each family and a port", svc.Spec.ClusterIPs, svc.Spec.Ports[0].NodePort)
	}
	start := time.Now()
	k.putSlice(t, apiSlice("dual", "pod-a", "pod-b"))
	k.putSlice(t, apiSlice6("dual", "pod-b", "pod-c"))
	nodePort := int(svc.Spec.Ports[0].NodePort)
	for _, c := range []struct {
		to   string
		port int
		want []string
	}{
		{svc.Spec.ClusterIPs[0], 80, []string{"pod-a", "pod-b"}},
		{svc.Spec.ClusterIPs[1], 80, []string{"pod-b", "pod-c"}},
		{e2eNodeIP, nodePort, []string{"pod-a", "pod-b"}},
		{apiNodeIP6, nodePort, []string{"pod-b", "pod-c"}},
	} {
		k.converge(t, apiChange, fmt.Sprintf("dual-stack Service on %s", net.JoinHostPort(c.to, fmt.Sprint(c.port))), start, func() error {
			return k.reach("tcp", c.to, c.port, 30, c.want...)
		})
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for line := range strings.Lines(s) {
		if strings.Contains(line, sub) {
			out = append(out, strings.TrimRight(line, "\n"))
		}
	}
	return strings.Join(out, "\n")
}

// healthy checks that /healthz answers 200 now.
func (k *apiNode) healthy() error {
	return expectGet(k.e2eNode, "http://"+e2eNodeIP+":10256/healthz", 200, `"healthy":true`)
}

// TestAPIServerRestart restarts the proxier's API server (SIGTERM, as an
// upgrade does) while the Services change through a second one: the rules
// stay while it is down, and the proxier reconnects and catches up. How
// client-go gets there depends on timing: a watch that resumes from a
// version older than the restarted server's watch cache gets 410 Gone and
// relists; one that the shutting-down server ended within a second, or
// that met the new server before its authorizer had loaded RBAC
// (Forbidden), relists at once. The test logs which it saw.
func TestAPIServerRestart(t *testing.T) {
	k := newAPINode(t, 2, apiservertest.Config{}, false)
	k.startProxier(t)
	k.createService(t, apiService("web", "10.96.0.10"))
	k.putSlice(t, apiSlice("web", "pod-a", "pod-b"))
	k.eventually(apiChange, "web", func() error { return k.reach("tcp", "10.96.0.10", 80, 30, "pod-a", "pod-b") })

	s := k.cluster.APIServer(0)
	s.Stop(t)
	down := time.Now()
	k.changeWhileAway(t)
	s.Start(t)
	up := time.Now()
	t.Logf("API server down for %v (until ready again)", up.Sub(down).Round(time.Millisecond))
	k.converge(t, apiRecovery, "catching up after the restart (from ready)", up, k.caughtUp)
	check(t, k.healthy())
	log := k.log.String()
	t.Logf("the proxier's watches ended with:\n%s", grepLines(grepLines(log, "reflector.go"), "err="))
}

// changeWhileAway changes web's endpoints and adds a Service while the
// proxier cannot reach its API server, and checks that meanwhile the
// rules stay and /healthz stays ok: as kube-proxy's, it reports whether
// the changes the proxier knows of are applied, not whether it hears of
// them. (Upstream declined to fail it on a lost API server,
// kubernetes/kubernetes#57109 and #57288: cloud load balancers check it,
// and one API server outage would take every node out of them at once.)
func (k *apiNode) changeWhileAway(t *testing.T) {
	t.Helper()
	k.putSlice(t, apiSlice("web", "pod-c"))
	k.createService(t, apiService("added", "10.96.0.20"))
	k.putSlice(t, apiSlice("added", "pod-b"))
	time.Sleep(2 * e2eSyncPeriod) // periodic syncs
	check(t, k.reach("tcp", "10.96.0.10", 80, 30, "pod-a", "pod-b"))
	check(t, k.healthy())
	if strings.Contains(k.log.String(), "e2e/added") {
		t.Fatal("the proxier heard of a Service created while it could not reach its API server")
	}
}

// caughtUp checks that traffic follows changeWhileAway.
func (k *apiNode) caughtUp() error {
	if err := k.reach("tcp", "10.96.0.10", 80, 10, "pod-c"); err != nil {
		return err
	}
	return k.reach("tcp", "10.96.0.20", 80, 10, "pod-b")
}

// TestAPIServerCompaction runs the API servers without a watch cache, so
// that the proxier's watches are etcd's, and crashes the proxier's server
// (SIGKILL: its watches end as a reset connection, which client-go
// resumes from the last resource version it saw). Until the server is
// ready again its address refuses the proxier, as a load balancer with no
// ready server behind it does. Without compaction the watches resume
// where they were; after etcd compacted their resource versions away
// they end with 410 Gone, and the proxier must relist to catch up. The
// second crash comes within two minutes of the first, before client-go
// resets its grown reconnection backoff, so the proxier takes longer to
// come back then.
func TestAPIServerCompaction(t *testing.T) {
	k := newAPINode(t, 2, apiservertest.Config{NoWatchCache: true}, false)
	k.startProxier(t)
	k.createService(t, apiService("web", "10.96.0.10"))
	k.putSlice(t, apiSlice("web", "pod-a", "pod-b"))
	k.eventually(apiChange, "web", func() error { return k.reach("tcp", "10.96.0.10", 80, 30, "pod-a", "pod-b") })

	crash := func(t *testing.T, change func(*testing.T), compact bool) {
		s := k.cluster.APIServer(0)
		k.refuseProxier(t, true)
		s.Kill(t)
		down := time.Now()
		change(t)
		if compact {
			t.Logf("etcd compacted at revision %d", k.cluster.Compact(t))
		}
		s.Start(t)
		k.refuseProxier(t, false)
		t.Logf("API server away for %v", time.Since(down).Round(time.Millisecond))
	}
	const gone = "too old"

	t.Run("crash resumes", func(t *testing.T) {
		crash(t, k.changeWhileAway, false)
		k.converge(t, apiRecovery, "catching up after a crash (from ready)", time.Now(), k.caughtUp)
		if strings.Contains(k.log.String(), gone) {
			t.Errorf("a 410 Gone without compaction:\n%s", grepLines(k.log.String(), gone))
		}
	})

	t.Run("compaction expires", func(t *testing.T) {
		crash(t, func(t *testing.T) {
			k.putSlice(t, apiSlice("web", "pod-a"))
			if err := k.kube.CoreV1().Services(e2eNS).Delete(k.ctx, "added", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}, true)
		k.converge(t, apiRecovery, "catching up after a crash and a compaction (from ready)", time.Now(), func() error {
			if err := k.reach("tcp", "10.96.0.10", 80, 20, "pod-a"); err != nil {
				return err
			}
			return k.unanswered("tcp", e2eClientIP, "10.96.0.20", 80)
		})
		for _, typ := range []string{"*v1.Service", "*v1.EndpointSlice"} {
			if lines := grepLines(k.log.String(), gone); !strings.Contains(lines, `type="`+typ+`"`) {
				t.Errorf("no 410 Gone for the %s watch: the compaction did not expire it; 410s seen:\n%s", typ, lines)
			}
		}
		check(t, k.healthy())
	})
}

// refuseProxier makes the proxier's API server refuse (or accept again)
// new connections from the node, in the control plane's namespace.
func (k *apiNode) refuseProxier(t *testing.T, refuse bool) {
	t.Helper()
	op := "-D"
	if refuse {
		op = "-I"
	}
	k.cpIPTables(t, op, "INPUT", "-p", "tcp", "--syn", "-s", apiNodeAddr, "-d", apiServerAddr(0).String(), "--dport", "6443",
		"-j", "REJECT", "--reject-with", "tcp-reset")
}

// TestAPIServerStalledWatch cuts the proxier's connection to its API
// server without closing it, as a lost NAT entry or a failed load balancer
// does: the watch hangs and neither end knows (kubernetes/kubernetes#65012).
// client-go's HTTP/2 health check notices, by a PING left unanswered after
// the connection has been idle: the test shortens it to 5s+3s from its
// default 30s+15s through client-go's own variables, or it would take 45s.
// The proxier must then reconnect and catch up on what changed meanwhile.
func TestAPIServerStalledWatch(t *testing.T) {
	t.Setenv("HTTP2_READ_IDLE_TIMEOUT_SECONDS", "5")
	t.Setenv("HTTP2_PING_TIMEOUT_SECONDS", "3")
	k := newAPINode(t, 1, apiservertest.Config{}, false)
	k.startProxier(t)
	k.createService(t, apiService("web", "10.96.0.10"))
	k.putSlice(t, apiSlice("web", "pod-a", "pod-b"))
	k.eventually(apiChange, "web", func() error { return k.reach("tcp", "10.96.0.10", 80, 30, "pod-a", "pod-b") })

	// Drop every packet of the proxier's open connections, in the control
	// plane's namespace; new connections pass.
	ports := k.proxierPorts(t)
	for _, port := range ports {
		k.cpIPTables(t, "-A", "INPUT", "-p", "tcp", "-s", apiNodeAddr, "--sport", port, "-j", "DROP")
		k.cpIPTables(t, "-A", "OUTPUT", "-p", "tcp", "-d", apiNodeAddr, "--dport", port, "-j", "DROP")
	}
	stalled := time.Now()
	k.putSlice(t, apiSlice("web", "pod-c"))
	// Well within the health check's 5s, the proxier has not heard.
	time.Sleep(2 * time.Second)
	check(t, k.reach("tcp", "10.96.0.10", 80, 30, "pod-a", "pod-b"))
	k.converge(t, apiRecovery, "catching up after a stalled watch (from the change)", stalled, func() error {
		return k.reach("tcp", "10.96.0.10", 80, 10, "pod-c")
	})
	// The API server still holds the dead connection open; the proxier
	// has a new one beside it.
	if now := k.proxierPorts(t); !slices.ContainsFunc(now, func(p string) bool { return !slices.Contains(ports, p) }) {
		t.Errorf("the proxier's connections are %v, were %v: want a new one", now, ports)
	}
	check(t, k.healthy())
}

// proxierPorts returns the node-side ports of the proxier's established
// connections to its API server.
func (k *apiNode) proxierPorts(t *testing.T) []string {
	t.Helper()
	out := k.cp.MustExec(t, "ss", "-Htn", "state", "established", "src", apiServerAddr(0).String(), "sport", "=", ":6443", "dst", apiNodeAddr)
	var ports []string
	for line := range strings.Lines(out) {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		if _, port, err := net.SplitHostPort(f[3]); err == nil {
			ports = append(ports, port)
		}
	}
	if len(ports) == 0 {
		t.Fatalf("no connection of the proxier to its API server:\n%s", out)
	}
	return ports
}

// cpIPTables runs iptables in the control plane's namespace, with a lock
// file of its own.
func (k *apiNode) cpIPTables(t *testing.T, args ...string) {
	t.Helper()
	err := k.cp.Do(func() error {
		cmd := exec.Command("iptables-"+string(k.backend), args...)
		cmd.Env = append(os.Environ(), "XTABLES_LOCKFILE="+k.lockFile+".cp")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("iptables %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
