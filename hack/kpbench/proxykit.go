package main

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxy"
)

// proxyKit is proxykit's side: the change trackers fed by the handlers, and
// at each sync the maps' Update, the input the proxier would build, and one
// rule writer's Sync, whose output goes to the same stand-in kernel tool as
// kube-proxy's (iptables-restore input; nft -f text through the recorder),
// or, for what nftables mode sends through netlink (the elements of a
// split first load, a partial sync's element batch), to the recorder's
// stand-in for the netlink socket, which is handed the batch's messages. The nftables writer reads the generation from the recorder, as
// the Mode's writer reads it from the kernel (its KernelState), which is
// what lets a forced full resync of a table no one else changed send only
// the difference without listing the elements. It leaves out the proxier's per-sync bookkeeping beside the writer
// (metrics, health servers, conntrack), which walks only what changed.
type proxyKit struct {
	svcTracker *changetracker.ServiceChangeTracker
	epTracker  *changetracker.EndpointsChangeTracker
	svcMap     changetracker.ServicePortMap
	epMap      changetracker.EndpointsMap
	ports      map[types.NamespacedName][]changetracker.ServicePortName
	full       bool
	nodeIPs    []netip.Addr
	// write renders in and hands the result to the kernel side, reporting
	// whether the sync was full.
	write    func(ctx context.Context, in *proxy.FamilyInput) (full bool, err error)
	sent     func() int64
	overhead func() time.Duration
	// fulls counts the syncs the writer made full.
	fulls int
}

func newProxyKit(mode string) (*proxyKit, error) {
	node := proxy.NodeConfig{Name: nodeName, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix(clusterCIDR)}}
	k := &proxyKit{
		svcTracker: changetracker.NewServiceChangeTracker(v1.IPv4Protocol, nil),
		epTracker:  changetracker.NewEndpointsChangeTracker(v1.IPv4Protocol, nodeName, nil),
		svcMap:     changetracker.ServicePortMap{},
		epMap:      changetracker.EndpointsMap{},
		ports:      map[types.NamespacedName][]changetracker.ServicePortName{},
		full:       true,
		nodeIPs:    []netip.Addr{netip.MustParseAddr(nodeIP)},
	}
	switch mode {
	case "iptables":
		// kube-proxy's defaults: localhost node ports on, --random-fully
		// (which it always writes). One commit for nat, as on legacy
		// iptables; the Mode splits it on the nft backend.
		w, err := iptables.NewWriter(iptables.WriterConfig{Family: v1.IPv4Protocol, Node: node, LocalhostNodePorts: true, RandomFully: true})
		if err != nil {
			return nil, err
		}
		var sent int64
		k.write = func(ctx context.Context, in *proxy.FamilyInput) (bool, error) {
			res := w.Sync(ctx, in)
			sent += int64(len(res.Payload))
			w.Applied(nil)
			return res.Full, nil
		}
		k.sent = func() int64 { return sent }
		k.overhead = func() time.Duration { return 0 }
	case "nftables":
		rec := newNFTRecorder()
		// The recorder's generation stands for the KernelState that the
		// Mode gives its writer (NewMode); the periodic resync is off,
		// as no step waits for it. The netlink paths are on, as the
		// Mode's over a real nft: the first load is split (the table,
		// chains and rules through nft, the bulk of the elements as a
		// netlink batch), and a partial sync of elements alone is a
		// batch.
		w, err := nftables.NewWriter(rec, nftables.WriterConfig{Family: v1.IPv4Protocol, Node: node, KernelState: rec,
			SplitFirstLoad: true, NetlinkElementSyncs: true})
		if err != nil {
			return nil, err
		}
		k.write = func(ctx context.Context, in *proxy.FamilyInput) (bool, error) {
			res := w.Sync(ctx, in)
			var err error
			if res.Transaction.NumOperations() > 0 {
				err = rec.Run(ctx, res.Transaction)
			}
			if err == nil && len(res.Elements) > 0 {
				err = rec.RunBatch(nftables.ElementBatch{Add: res.Elements})
			}
			if err == nil && res.Batch != nil {
				err = rec.RunBatch(*res.Batch)
			}
			w.Applied(err)
			return res.Full, err
		}
		k.sent = func() int64 { return rec.bytes }
		k.overhead = func() time.Duration { return rec.overhead }
	default:
		return nil, fmt.Errorf("unknown mode %q", mode)
	}
	return k, nil
}

func (k *proxyKit) service(old, cur *v1.Service) { k.svcTracker.Update(old, cur) }

func (k *proxyKit) slice(_, cur *discoveryv1.EndpointSlice) {
	k.epTracker.EndpointSliceUpdate(cur, false)
}

func (k *proxyKit) requestFull() { k.full = true }

// sync builds the input as proxier's sync does (the maps' Update, and the
// changed Services with their ports) and writes it.
func (k *proxyKit) sync() error {
	in := &proxy.FamilyInput{
		Family:          v1.IPv4Protocol,
		Services:        k.svcMap,
		Endpoints:       k.epMap,
		ServiceChanges:  k.svcMap.Update(k.svcTracker),
		EndpointChanges: k.epMap.Update(k.epTracker),
		NodeIPs:         k.nodeIPs,
		Full:            k.full,
	}
	ports := in.ServiceChanges.PortsIn(k.svcMap)
	changed := make(map[types.NamespacedName][]changetracker.ServicePortName, len(in.ServiceChanges.UpdatedServices)+len(in.EndpointChanges.UpdatedServices))
	for svc := range in.ServiceChanges.UpdatedServices {
		if ps := ports[svc]; len(ps) > 0 {
			k.ports[svc] = ps
		} else {
			delete(k.ports, svc)
		}
		changed[svc] = k.ports[svc]
	}
	for svc := range in.EndpointChanges.UpdatedServices {
		changed[svc] = k.ports[svc]
	}
	in.ChangedServices = changed
	full, err := k.write(context.Background(), in)
	if full {
		k.fulls++
	}
	if err != nil {
		return err
	}
	k.full = false
	return nil
}

func (k *proxyKit) bytes() int64             { return k.sent() }
func (k *proxyKit) kernelCPU() time.Duration { return k.overhead() }
