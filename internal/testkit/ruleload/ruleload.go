// Package ruleload programs a cluster's Services into a network namespace
// with the writers of iptables mode and nftables mode, the way their
// proxiers apply a first full sync, for the measurements that compare the
// modes' rules with real connections (internal/lab). It reads the
// iptables rules back in the order a new connection meets them.
package ruleload

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxy"
)

// NFTables renders in, of IPv4, with nftables mode's writer for node and
// applies it in ns's table of the writer's default name, with one nft
// transaction. The sync runs inside ns as well: a first full sync lists
// the table. It returns how long nft took to apply the transaction.
func NFTables(ns *kerneltest.NS, node proxy.NodeConfig, in *proxy.FamilyInput) (time.Duration, error) {
	ctx := context.Background()
	var took time.Duration
	err := ns.Do(func() error {
		nft, err := knftables.New(knftables.IPv4Family, nftables.DefaultTableName)
		if err != nil {
			return err
		}
		w, err := nftables.NewWriter(nft, nftables.WriterConfig{Family: v1.IPv4Protocol, Node: node})
		if err != nil {
			return err
		}
		res := w.Sync(ctx, in)
		start := time.Now()
		err = nft.Run(ctx, res.Transaction)
		took = time.Since(start)
		w.Applied(err)
		return err
	})
	return took, err
}

// IPTables renders in, of IPv4, with iptables mode's writer for node and
// applies it in ns with backend's iptables-restore, after the jump rules,
// using lockFile as the xtables lock (the lock is host-wide, so each
// namespace wants its own). On the nft backend it commits
// iptables.NFTChainsPerCommit chains at a time, as iptables mode does. It
// returns the Interface it applied with, for reading the rules back, and
// how long the jump rules and iptables-restore took.
func IPTables(ns *kerneltest.NS, backend iptables.Backend, lockFile string, node proxy.NodeConfig, in *proxy.FamilyInput) (iptables.Interface, time.Duration, error) {
	ctx := context.Background()
	chainsPerCommit := 0
	if backend == iptables.BackendNFT {
		chainsPerCommit = iptables.NFTChainsPerCommit
	}
	var ipt iptables.Interface
	var took time.Duration
	err := ns.Do(func() error {
		var err error
		ipt, err = iptables.New(ctx, v1.IPv4Protocol, iptables.WithBackend(backend), iptables.WithLockFile(lockFile))
		if err != nil {
			return err
		}
		w, err := iptables.NewWriter(iptables.WriterConfig{
			Family: v1.IPv4Protocol, Node: node,
			RandomFully: ipt.HasRandomFully(), ChainsPerCommit: chainsPerCommit,
		})
		if err != nil {
			return err
		}
		res := w.Sync(ctx, in)
		start := time.Now()
		err = w.EnsureJumpRules(ctx, ipt)
		if err == nil {
			err = ipt.RestoreAll(ctx, res.Payload, iptables.NoFlushTables, iptables.RestoreCounters)
		}
		took = time.Since(start)
		w.Applied(err)
		return err
	})
	return ipt, took, err
}

// ServiceOrder returns the cluster IPs of the nat table's KUBE-SERVICES
// rules that jump to a service chain, read through ipt in ns, in the
// order a new connection is matched against them.
func ServiceOrder(ns *kerneltest.NS, ipt iptables.Interface) ([]netip.Addr, error) {
	var buf bytes.Buffer
	if err := ns.Do(func() error {
		return ipt.ListRules(context.Background(), iptables.TableNAT, "KUBE-SERVICES", &buf)
	}); err != nil {
		return nil, err
	}
	var ips []netip.Addr
	for line := range strings.Lines(buf.String()) {
		rest, ok := strings.CutPrefix(line, "-A KUBE-SERVICES -d ")
		if !ok || !strings.Contains(line, " -j KUBE-SVC-") {
			continue
		}
		dst, _, _ := strings.Cut(rest, " ")
		p, err := netip.ParsePrefix(dst)
		if err != nil || !p.IsSingleIP() {
			return nil, fmt.Errorf("KUBE-SERVICES rule for %q: want one address", dst)
		}
		ips = append(ips, p.Addr())
	}
	return ips, nil
}
