package main

import (
	"context"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/kernel"
)

// initNode is --init-only: the node set-up of o.mode that needs more than
// CAP_NET_ADMIN, as kube-proxy does it before it exits with the flag, so
// that the proxier can then run with that capability alone. It needs no
// cluster: it tunes conntrack, removes the rules other modes left, and,
// per mode, sets route_localnet (iptables mode, when node ports are
// served on 127.0.0.1) or checks and loads what IPVS mode needs and sets
// its sysctls. It writes none of the mode's own rules: the first sync of
// the next run does.
func initNode(ctx context.Context, o *options, env *environment) error {
	logger := klog.FromContext(ctx)
	both := []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
	switch o.mode {
	case modeIPVS:
		if err := env.kernel.CanUseIPVS(ctx, o.ipvsSchedulers()...); err != nil {
			return fmt.Errorf("--mode ipvs: %w", err)
		}
		if err := ipvsmode.TuneKernel(ctx, env.kernel); err != nil {
			return err
		}
		tuneConntrack(ctx, env.kernel, o.conntrack)
		ipts, _, err := familyIPTables(ctx, env, both)
		if err != nil {
			return err
		}
		removeIPTablesMode(ctx, o.names, ipts)
		removeNFTablesMode(ctx, env, o.nftTable)
	case modeNFTables:
		tuneConntrack(ctx, env.kernel, o.conntrack)
		removeIPTablesModes(ctx, env, o.names)
	default:
		ipts, _, err := familyIPTables(ctx, env, both)
		if err != nil {
			return err
		}
		tuneConntrack(ctx, env.kernel, o.conntrack)
		removeIPVSMode(ctx, env, o.names, ipts)
		removeNFTablesMode(ctx, env, o.nftTable)
		if localhostNodePorts(o) {
			if _, err := env.kernel.EnsureSysctlInt(ctx, kernel.SysctlRouteLocalnet, 1); err != nil {
				return fmt.Errorf("localhost node ports (--iptables-localhost-nodeports): %w", err)
			}
		}
	}
	logger.Info("Node set up and --init-only given: exiting", "mode", o.mode)
	return nil
}

// localhostNodePorts reports whether iptables mode serves IPv4 node ports
// on 127.0.0.1: with --iptables-localhost-nodeports, when the node-port
// addresses include it (all of them do by default; the node's own,
// "primary", do not).
func localhostNodePorts(o *options) bool {
	if !o.localhostNodePorts || o.nodePortPrimary {
		return false
	}
	if len(o.nodePortAddresses) == 0 {
		return true
	}
	loopback := netip.MustParseAddr("127.0.0.1")
	for _, p := range o.nodePortAddresses {
		if p.Contains(loopback) {
			return true
		}
	}
	return false
}
