package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"time"
	"unsafe"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	sysctltesting "k8s.io/component-helpers/node/util/sysctl/testing"
	"k8s.io/kubernetes/pkg/proxy"
	proxyconfig "k8s.io/kubernetes/pkg/proxy/apis/config"
	"k8s.io/kubernetes/pkg/proxy/conntrack"
	kpiptables "k8s.io/kubernetes/pkg/proxy/iptables"
	"k8s.io/kubernetes/pkg/proxy/metrics"
	kpnftables "k8s.io/kubernetes/pkg/proxy/nftables"
	proxyutil "k8s.io/kubernetes/pkg/proxy/util"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"
)

// The addresses both sides are configured with.
const (
	nodeIP      = "192.168.0.10"
	clusterCIDR = "10.128.0.0/10"
)

// kubeProxy drives one of kube-proxy's Proxiers through its exported
// handlers, as its informers would. Its syncs are run by hand: the
// handlers' Sync only signals a runner whose loop is never started, and
// OnEndpointSlicesSynced runs syncProxyRules at once, whatever is pending.
type kubeProxy struct {
	p      proxy.Provider
	synced bool
	sent   func() int64
	// overhead is the stand-in kernel's own CPU time (nftRecorder's).
	overhead func() time.Duration
	failed   func() int
}

func (k *kubeProxy) service(old, cur *v1.Service) {
	if old == nil {
		k.p.OnServiceAdd(cur)
		return
	}
	k.p.OnServiceUpdate(old, cur)
}

func (k *kubeProxy) slice(old, cur *discoveryv1.EndpointSlice) {
	if old == nil {
		k.p.OnEndpointSliceAdd(cur)
		return
	}
	k.p.OnEndpointSliceUpdate(old, cur)
}

func (k *kubeProxy) sync() error {
	n := k.failed()
	if !k.synced {
		// Both "synced" calls are needed before the first sync runs; the
		// first returns at once, as not initialized.
		k.p.OnServiceSynced()
		k.synced = true
	}
	k.p.OnEndpointSlicesSynced()
	if k.failed() != n {
		return fmt.Errorf("kube-proxy's transaction failed")
	}
	return nil
}

// requestFull does what a node topology change does: needFullSync, and a
// signal to the (idle) runner. The labels stay nil, as they were.
func (k *kubeProxy) requestFull() { k.p.OnTopologyChange(nil) }

func (k *kubeProxy) bytes() int64             { return k.sent() }
func (k *kubeProxy) kernelCPU() time.Duration { return k.overhead() }

// kubeProxyConfig is kube-proxy's defaults for what the Proxiers read.
func kubeProxyConfig() *proxyconfig.KubeProxyConfiguration {
	return &proxyconfig.KubeProxyConfiguration{
		IPTables:      proxyconfig.KubeProxyIPTablesConfiguration{MasqueradeBit: ptr.To[int32](14), LocalhostNodePorts: ptr.To(true)},
		NFTables:      proxyconfig.KubeProxyNFTablesConfiguration{MasqueradeBit: ptr.To[int32](14)},
		SyncPeriod:    metav1.Duration{Duration: 30 * time.Second},
		MinSyncPeriod: metav1.Duration{Duration: time.Second},
	}
}

func newKubeProxyIPTables(ctx context.Context) (*kubeProxy, error) {
	metrics.RegisterMetrics(proxyconfig.ProxyModeIPTables)
	ipt := &iptRecorder{}
	p, err := kpiptables.NewProxier(ctx, kubeProxyConfig(), v1.IPv4Protocol, ipt, sysctltesting.NewFake(),
		proxyutil.NewDetectLocalByCIDR(clusterCIDR), nodeName, net.ParseIP(nodeIP), events.NewFakeRecorder(100), nil, false)
	if err != nil {
		return nil, err
	}
	// NewProxier opens the host's nfacct and conntrack; the first sync
	// would create nfacct counters there. The test fake's conntrack, and
	// no nfacct, as on a node without it.
	setField(p, "nfacct", nil)
	setField(p, "conntrack", conntrack.NewFake())
	return &kubeProxy{p: p, sent: func() int64 { return ipt.bytes }, overhead: func() time.Duration { return 0 }, failed: func() int { return 0 }}, nil
}

func newKubeProxyNFTables(ctx context.Context) (*kubeProxy, error) {
	metrics.RegisterMetrics(proxyconfig.ProxyModeNFTables)
	// NewProxier makes its Interface with knftables.New, which runs nft to
	// check it works: give it an nft that answers without touching the
	// kernel, then replace the Interface with the recorder.
	dir, err := os.MkdirTemp("", "kpbench-nft")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	stub := "#!/bin/sh\ncat >/dev/null\n[ \"$1\" = --version ] && echo 'nftables v1.0.6 (kpbench stand-in)'\nexit 0\n"
	if err := os.WriteFile(filepath.Join(dir, "nft"), []byte(stub), 0o755); err != nil {
		return nil, err
	}
	path := os.Getenv("PATH")
	os.Setenv("PATH", dir+string(os.PathListSeparator)+path)
	defer os.Setenv("PATH", path)

	p, err := kpnftables.NewProxier(ctx, kubeProxyConfig(), v1.IPv4Protocol,
		proxyutil.NewDetectLocalByCIDR(clusterCIDR), nodeName, net.ParseIP(nodeIP), events.NewFakeRecorder(100), nil, false)
	if err != nil {
		return nil, err
	}
	rec := newNFTRecorder()
	setField(p, "nftables", knftables.Interface(rec))
	setField(p, "conntrack", conntrack.NewFake())
	return &kubeProxy{p: p, sent: func() int64 { return rec.bytes }, overhead: func() time.Duration { return rec.overhead }, failed: func() int { return rec.failed }}, nil
}

// setField sets the unexported field name of the struct p points to: the
// Proxiers take their kernel side from the host in NewProxier, and kube-proxy's
// own tests set these fields from inside the package, which this cannot.
func setField(p any, name string, val any) {
	f := reflect.ValueOf(p).Elem().FieldByName(name)
	if !f.IsValid() {
		panic(fmt.Sprintf("%T has no field %s", p, name))
	}
	f = reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem()
	if val == nil {
		f.SetZero()
		return
	}
	f.Set(reflect.ValueOf(val))
}
