package iptables_test

import (
	"context"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/proxy"
)

// A proxier's sync loop: the change trackers are fed by informers (here,
// by hand), and each sync brings the maps up to date, renders the rules
// and applies them. The Fake stands in for iptables.New; in a proxier,
// sync is the function a runner.Runner calls.
func ExampleWriter() {
	ctx := context.Background()
	ipt := iptablestest.NewFake()
	cfg := iptables.WriterConfig{
		Family:      v1.IPv4Protocol,
		Node:        proxy.NodeConfig{Name: "node-a", ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")}},
		RandomFully: ipt.HasRandomFully(),
	}
	if ipt.Backend() == iptables.BackendNFT {
		cfg.ChainsPerCommit = iptables.NFTChainsPerCommit
	}
	w, err := iptables.NewWriter(cfg)
	if err != nil {
		panic(err)
	}
	svcTracker := changetracker.NewServiceChangeTracker(v1.IPv4Protocol, nil)
	epTracker := changetracker.NewEndpointsChangeTracker(v1.IPv4Protocol, "node-a", nil)
	svcMap, epMap := changetracker.ServicePortMap{}, changetracker.EndpointsMap{}

	sync := func() error {
		res := w.Sync(ctx, &proxy.FamilyInput{
			Services:        svcMap,
			Endpoints:       epMap,
			ServiceChanges:  svcMap.Update(svcTracker),
			EndpointChanges: epMap.Update(epTracker),
		})
		var err error
		if res.Full {
			err = w.EnsureJumpRules(ctx, ipt)
		}
		if err == nil && len(res.Payload) > 0 {
			err = ipt.RestoreAll(ctx, res.Payload, iptables.NoFlushTables, iptables.RestoreCounters)
		}
		// Always report the outcome: after a failure the next sync is full.
		w.Applied(err)
		fmt.Printf("full=%v service ports written=%d endpoints=%d\n", res.Full, res.ServicePortsWritten, res.Endpoints)
		return err
	}

	svcTracker.Update(nil, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "web"},
		Spec: v1.ServiceSpec{
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			Ports:      []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
		},
	})
	slice := func(ips ...string) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "demo", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		}
		for _, ip := range ips {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}})
		}
		return s
	}
	epTracker.EndpointSliceUpdate(slice("10.0.1.1", "10.0.2.1"), false)
	if err := sync(); err != nil {
		panic(err)
	}

	// One endpoint goes away: the next sync rewrites that service alone.
	epTracker.EndpointSliceUpdate(slice("10.0.1.1"), false)
	if err := sync(); err != nil {
		panic(err)
	}

	web := changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "demo", Name: "web"}, Port: "http", Protocol: v1.ProtocolTCP}
	for _, rule := range ipt.Rules(iptables.TableNAT, iptables.DefaultChainNames().ServiceCluster(web)) {
		fmt.Println(rule)
	}
	// Output:
	// full=true service ports written=1 endpoints=2
	// full=false service ports written=1 endpoints=1
	// ! -s 10.0.0.0/16 -d 10.96.0.10/32 -p tcp -m comment --comment "demo/web:http cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
	// -m comment --comment "demo/web:http -> 10.0.1.1:8080" -j KUBE-SEP-DLRZWJNJAPXTRWRZ
}

// The payload of a sync can be printed instead of applied, for a dry run.
func ExampleWriter_dryRun() {
	w, err := iptables.NewWriter(iptables.WriterConfig{Family: v1.IPv4Protocol})
	if err != nil {
		panic(err)
	}
	res := w.Sync(context.Background(), &proxy.FamilyInput{})
	fmt.Print(string(res.Payload))
	// Output:
	// *nat
	// :KUBE-POSTROUTING - [0:0]
	// :KUBE-MARK-MASQ - [0:0]
	// -A KUBE-POSTROUTING -m mark ! --mark 0x00004000/0x00004000 -j RETURN
	// -A KUBE-POSTROUTING -j MARK --xor-mark 0x00004000
	// -A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE
	// -A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000
	// :KUBE-SERVICES - [0:0]
	// :KUBE-NODEPORTS - [0:0]
	// -A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j KUBE-NODEPORTS
	// COMMIT
	// *filter
	// :KUBE-SERVICES - [0:0]
	// :KUBE-EXTERNAL-SERVICES - [0:0]
	// :KUBE-FORWARD - [0:0]
	// :KUBE-NODEPORTS - [0:0]
	// :KUBE-PROXY-FIREWALL - [0:0]
	// -A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
	// -A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x00004000/0x00004000 -j ACCEPT
	// -A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
	// COMMIT
}
