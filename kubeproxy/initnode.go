package kubeproxy

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipvs"
)

// InitNode is the node set-up of cfg.Mode that needs more than
// CAP_NET_ADMIN, as kube-proxy does it with --init-only, so that the
// proxier can then run with that capability alone. It needs no cluster:
// it tunes conntrack, removes the state other modes left (see Cleanup),
// and, per mode, sets route_localnet (iptables mode, when node ports are
// served on 127.0.0.1) or checks and loads what IPVS mode needs and sets
// its sysctls, with Config.IPVSTuning's strict ARP and timeouts. It
// writes none of the mode's own rules: the first sync of
// the proxier does. It fails when IPVS mode cannot run on this kernel,
// when the primary family's iptables does not work (iptables and IPVS
// mode), or when a sysctl the mode needs cannot be set; a failed conntrack
// tuning or removal is logged. A Config that does not validate fails it
// before it touches anything. It reads only WithHost.
func InitNode(ctx context.Context, cfg *Config, opts ...Option) error {
	s, err := newSetup(cfg, opts)
	if err != nil {
		return err
	}
	both := []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
	switch s.cfg.mode() {
	case ModeIPVS:
		if err := s.prepareIPVS(ctx); err != nil {
			return err
		}
		if err := s.initIPVS(ctx); err != nil {
			return err
		}
		s.tuneConntrack(ctx)
		ipts, _, err := s.familyIPTables(ctx, both)
		if err != nil {
			return err
		}
		s.removeIPTablesMode(ctx, ipts)
		s.removeNFTablesMode(ctx)
	case ModeNFTables, ModeEBPF:
		s.tuneConntrack(ctx)
		s.removeIPTablesModes(ctx)
	default:
		ipts, _, err := s.familyIPTables(ctx, both)
		if err != nil {
			return err
		}
		s.tuneConntrack(ctx)
		s.removeIPVSMode(ctx, ipts)
		s.removeNFTablesMode(ctx)
		if s.cfg.localhostNodePorts() {
			if err := s.setRouteLocalnet(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// initIPVS sets IPVS mode's sysctls and IPVSTuning, as kube-proxy does
// before --init-only returns; it opens the IPVS table only when there are
// timeouts to set.
func (s *setup) initIPVS(ctx context.Context) error {
	var iface ipvs.Interface
	if s.cfg.IPVSTuning.Timeouts != (ipvs.Timeouts{}) {
		k, err := s.host.OpenIPVS(ctx, true)
		if err != nil {
			return fmt.Errorf("--mode ipvs: %w", err)
		}
		defer k.Close()
		iface = k.IPVS
	}
	return s.tuneIPVS(ctx, iface)
}
