package kubeproxy

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/proxykit/proxykit/kernel"
	"github.com/proxykit/proxykit/proxy"
)

// kube-proxy's ports of the health and metrics servers, for an address
// given without one.
const (
	DefaultHealthzPort = "10256"
	DefaultMetricsPort = "10249"
)

// FromConfiguration resolves kc, as Decode returns it, into a Config with
// kube-proxy's defaults for what kc leaves zero:
//
//   - mode iptables;
//   - the health server on 0.0.0.0:10256 and the metrics server on
//     127.0.0.1:10249, or [::]:10256 and [::1]:10249 when bindAddress is
//     IPv6 (an address without a port gets the default port; an empty
//     address is the default, so a file cannot turn a server off);
//   - the sync periods of the mode's section (iptables and IPVS mode read
//     the iptables and ipvs sections, nftables mode the nftables one):
//     syncPeriod 30s, minSyncPeriod 1s (0 in IPVS mode);
//   - masqueradeAll and masqueradeBit of the iptables section, the
//     nftables section's in nftables mode;
//   - iptables.localhostNodePorts true; nodePortAddresses "primary" in
//     nftables mode, every address in the others (see NodePortAddresses);
//   - the conntrack section as ConntrackTuning reads it;
//   - in IPVS mode, the ipvs section's excludeCIDRs, strictARP and
//     timeouts as IPVSSettings reads them.
//   - detectLocalMode ClusterCIDR, which Config holds as "".
//
// The fields Config has and a KubeProxyConfiguration has not
// (DriftCheckPeriod, ChainPrefix) are zero, and the fields Unsupported
// names are not read. It fails on a value kube-proxy refuses, or that
// proxykit does not implement (another mode, a nodePortAddresses entry
// "localhost", two clusterCIDRs of one family), or an interface name in
// detectLocal that could not reach iptables or nft safely (see
// proxy.ValidateInterfaceName), naming the field by its path
// ("iptables.minSyncPeriod: ..."); the returned Config validates.
func FromConfiguration(kc *kubeproxyconfig.KubeProxyConfiguration) (*Config, error) {
	c := &Config{Mode: string(kc.Mode)}
	switch c.Mode {
	case ModeIPTables, ModeIPVS, ModeNFTables:
	case "":
		c.Mode = ModeIPTables
	default:
		return nil, fmt.Errorf("mode: %q is not a mode this proxier has; want %q, %q or %q", kc.Mode, ModeIPTables, ModeIPVS, ModeNFTables)
	}
	if err := c.detectLocalFrom(kc); err != nil {
		return nil, err
	}

	// kube-proxy defaults both servers' addresses to bindAddress's family.
	healthz, metrics := "0.0.0.0:"+DefaultHealthzPort, "127.0.0.1:"+DefaultMetricsPort
	if a, err := netip.ParseAddr(kc.BindAddress); err == nil && a.Is6() && !a.Is4In6() {
		healthz, metrics = "[::]:"+DefaultHealthzPort, "[::1]:"+DefaultMetricsPort
	}
	for _, s := range []struct {
		field, value, def, port string
		into                    *string
	}{
		{"healthzBindAddress", kc.HealthzBindAddress, healthz, DefaultHealthzPort, &c.HealthzBindAddress},
		{"metricsBindAddress", kc.MetricsBindAddress, metrics, DefaultMetricsPort, &c.MetricsBindAddress},
	} {
		value := s.value
		if value == "" {
			value = s.def
		}
		addr, err := BindAddress(s.field, value, s.port)
		if err != nil {
			return nil, err
		}
		*s.into = addr
	}

	for _, s := range strings.Split(kc.ClusterCIDR, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("clusterCIDR: %w", err)
		}
		c.ClusterCIDRs = append(c.ClusterCIDRs, p.Masked())
	}
	if err := OnePerFamily("clusterCIDR", c.ClusterCIDRs); err != nil {
		return nil, err
	}
	var err error
	if c.NodePortAddresses, c.NodePortPrimary, err = NodePortAddresses(kc.NodePortAddresses); err != nil {
		return nil, err
	}
	// kube-proxy's nftables mode serves node ports on the node's own
	// addresses unless told otherwise: its nodePortAddresses default.
	if c.Mode == ModeNFTables && c.NodePortAddresses == nil {
		c.NodePortPrimary = true
	}

	// kube-proxy reads masqueradeAll and masqueradeBit from the iptables
	// section in IPVS mode too, and from the nftables section in nftables
	// mode.
	masqSection, masqBit := "iptables", kc.IPTables.MasqueradeBit
	c.MasqueradeAll = kc.IPTables.MasqueradeAll
	if c.Mode == ModeNFTables {
		masqSection, masqBit = "nftables", kc.NFTables.MasqueradeBit
		c.MasqueradeAll = kc.NFTables.MasqueradeAll
	}
	if b := masqBit; b != nil {
		if *b < 0 || *b > 31 {
			return nil, fmt.Errorf("%s.masqueradeBit: %d: must be within the range [0, 31]", masqSection, *b)
		}
		bit := int(*b)
		c.MasqueradeBit = &bit
	}
	c.LocalhostNodePorts = true
	if kc.IPTables.LocalhostNodePorts != nil {
		c.LocalhostNodePorts = *kc.IPTables.LocalhostNodePorts
	}

	if err := c.syncPeriodsFrom(kc); err != nil {
		return nil, err
	}

	if c.Mode == ModeIPVS && kc.IPVS.Scheduler != "" {
		if _, err := kernel.IPVSSchedulerModule(kc.IPVS.Scheduler); err != nil {
			return nil, fmt.Errorf("ipvs.scheduler: %w", err)
		}
		c.IPVSScheduler = kc.IPVS.Scheduler
	}

	if c.Mode == ModeIPVS {
		// As kube-proxy: the ipvs section is read, and checked, in IPVS
		// mode alone.
		if c.IPVSTuning, c.IPVSExcludeCIDRs, err = IPVSSettings(kc.IPVS); err != nil {
			return nil, err
		}
	}

	tuning, err := ConntrackTuning(kc.Conntrack)
	if err != nil {
		return nil, err
	}
	c.Conntrack = &tuning
	return c, nil
}

// syncPeriodsFrom sets the sync periods from the mode's section of kc.
// kube-proxy defaults a zero syncPeriod to 30s in each, and a zero
// minSyncPeriod to 1s in the iptables and nftables sections.
func (c *Config) syncPeriodsFrom(kc *kubeproxyconfig.KubeProxyConfiguration) error {
	section, sync, minSync, minDefault := "iptables", kc.IPTables.SyncPeriod.Duration, kc.IPTables.MinSyncPeriod.Duration, time.Second
	switch c.Mode {
	case ModeIPVS:
		section, sync, minSync, minDefault = "ipvs", kc.IPVS.SyncPeriod.Duration, kc.IPVS.MinSyncPeriod.Duration, 0
	case ModeNFTables:
		section, sync, minSync = "nftables", kc.NFTables.SyncPeriod.Duration, kc.NFTables.MinSyncPeriod.Duration
	}
	if sync < 0 {
		return fmt.Errorf("%s.syncPeriod: %v: must be greater than 0", section, sync)
	}
	if sync == 0 {
		sync = 30 * time.Second
	}
	if minSync < 0 {
		return fmt.Errorf("%s.minSyncPeriod: %v: must be greater than or equal to 0", section, minSync)
	}
	if minSync == 0 {
		minSync = minDefault
	}
	if minSync > sync {
		return fmt.Errorf("%s.minSyncPeriod: %v: must not be longer than %s.syncPeriod (%v)", section, minSync, section, sync)
	}
	c.SyncPeriod, c.MinSyncPeriod = sync, minSync
	return nil
}

// BindAddress reads a server's address as kube-proxy does: "" (the
// server off), "IP:port", or a bare IP, which gets defaultPort. Anything
// else is an error that names field.
func BindAddress(field, value, defaultPort string) (string, error) {
	if value == "" {
		return "", nil
	}
	if a, err := netip.ParseAddr(value); err == nil {
		return net.JoinHostPort(a.String(), defaultPort), nil
	}
	if _, err := netip.ParseAddrPort(value); err != nil {
		return "", fmt.Errorf("%s %q: want IP:port or an IP: %w", field, value, err)
	}
	return value, nil
}

// Configuration is c as a KubeProxyConfiguration (v1alpha1): read back
// with FromConfiguration, it gives c again, but for what a file cannot
// say. The sync periods and masquerading go to the mode's section, where
// kube-proxy reads them. Two values cannot be told apart from the
// defaults in a file, for kube-proxy as for proxykit, and read back as
// the defaults: a server turned off (an empty address) and an iptables or
// nftables MinSyncPeriod of 0. DriftCheckPeriod and ChainPrefix, which a
// KubeProxyConfiguration has no field for, are left out; so are the
// fields that are not Config's (hostnameOverride, clientConnection,
// logging), for the caller to fill in.
func (c *Config) Configuration() *kubeproxyconfig.KubeProxyConfiguration {
	kc := &kubeproxyconfig.KubeProxyConfiguration{
		TypeMeta:           metav1.TypeMeta{APIVersion: kubeproxyconfig.SchemeGroupVersion.String(), Kind: "KubeProxyConfiguration"},
		BindAddress:        "0.0.0.0",
		HealthzBindAddress: c.HealthzBindAddress,
		MetricsBindAddress: c.MetricsBindAddress,
		Mode:               kubeproxyconfig.ProxyMode(c.mode()),
		ClusterCIDR:        strings.Join(prefixStrings(c.ClusterCIDRs), ","),
		DetectLocalMode:    kubeproxyconfig.LocalMode(proxy.LocalModeClusterCIDR),
		DetectLocal:        kubeproxyconfig.DetectLocalConfiguration{BridgeInterface: c.BridgeInterface, InterfaceNamePrefix: c.InterfaceNamePrefix},
	}
	if c.DetectLocalMode != "" {
		kc.DetectLocalMode = kubeproxyconfig.LocalMode(c.DetectLocalMode)
	}
	localhost := c.LocalhostNodePorts
	kc.IPTables.LocalhostNodePorts = &localhost
	sync, minSync := metav1.Duration{Duration: c.syncPeriod()}, metav1.Duration{Duration: c.MinSyncPeriod}
	var bit *int32
	if c.MasqueradeBit != nil {
		b := int32(*c.MasqueradeBit)
		bit = &b
	}
	switch c.mode() {
	case ModeNFTables:
		n := &kc.NFTables
		n.SyncPeriod, n.MinSyncPeriod, n.MasqueradeAll, n.MasqueradeBit = sync, minSync, c.MasqueradeAll, bit
	case ModeIPVS:
		kc.IPVS.SyncPeriod, kc.IPVS.MinSyncPeriod, kc.IPVS.Scheduler = sync, minSync, c.IPVSScheduler
		kc.IPVS.ExcludeCIDRs, kc.IPVS.StrictARP = prefixStrings(c.IPVSExcludeCIDRs), c.IPVSTuning.StrictARP
		to := c.IPVSTuning.Timeouts
		kc.IPVS.TCPTimeout, kc.IPVS.TCPFinTimeout, kc.IPVS.UDPTimeout = metav1.Duration{Duration: to.TCP}, metav1.Duration{Duration: to.TCPFin}, metav1.Duration{Duration: to.UDP}
		// IPVS mode masquerades as the iptables section says.
		kc.IPTables.MasqueradeAll, kc.IPTables.MasqueradeBit = c.MasqueradeAll, bit
	default:
		i := &kc.IPTables
		i.SyncPeriod, i.MinSyncPeriod, i.MasqueradeAll, i.MasqueradeBit = sync, minSync, c.MasqueradeAll, bit
	}
	if c.NodePortPrimary {
		kc.NodePortAddresses = []string{"primary"}
	} else {
		kc.NodePortAddresses = prefixStrings(c.NodePortAddresses)
	}

	t := c.Conntrack
	if t == nil {
		return kc
	}
	ct := &kc.Conntrack
	// A maxPerCore of 0 or none leaves nf_conntrack_max alone.
	if t.MaxPerCore > 0 {
		maxPerCore, minimum := int32(t.MaxPerCore), int32(t.Min)
		ct.MaxPerCore, ct.Min = &maxPerCore, &minimum
	}
	duration := func(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }
	ct.TCPEstablishedTimeout, ct.TCPCloseWaitTimeout = duration(t.TCPEstablishedTimeout), duration(t.TCPCloseWaitTimeout)
	ct.TCPBeLiberal = t.TCPBeLiberal
	ct.UDPTimeout, ct.UDPStreamTimeout = *duration(t.UDPTimeout), *duration(t.UDPStreamTimeout)
	return kc
}

// prefixStrings is ps in text; nil for none.
func prefixStrings(ps []netip.Prefix) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}

// detectLocalFrom takes detectLocalMode and detectLocal from kc, checked as
// kube-proxy checks them, and more: the mode must be one of kube-proxy's
// (a typo must not run the node without local-traffic detection), the
// interface name its mode reads must be given, and an interface name given
// must be one that can reach iptables and nft (proxy.ValidateInterfaceName)
// whatever the mode, naming the field at fault.
func (c *Config) detectLocalFrom(kc *kubeproxyconfig.KubeProxyConfiguration) error {
	mode := proxy.LocalMode(kc.DetectLocalMode)
	switch mode {
	case "", proxy.LocalModeClusterCIDR, proxy.LocalModeNodeCIDR, proxy.LocalModeBridgeInterface, proxy.LocalModeInterfaceNamePrefix:
	default:
		return fmt.Errorf("detectLocalMode: %q is not a mode kube-proxy has; want ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix", kc.DetectLocalMode)
	}
	d := kc.DetectLocal
	if d.BridgeInterface != "" || mode == proxy.LocalModeBridgeInterface {
		if err := proxy.ValidateInterfaceName(d.BridgeInterface); err != nil {
			return fmt.Errorf("detectLocal.bridgeInterface: %w", err)
		}
	}
	if d.InterfaceNamePrefix != "" || mode == proxy.LocalModeInterfaceNamePrefix {
		if err := proxy.ValidateInterfaceNamePrefix(d.InterfaceNamePrefix); err != nil {
			return fmt.Errorf("detectLocal.interfaceNamePrefix: %w", err)
		}
	}
	if mode == proxy.LocalModeClusterCIDR {
		// Config's zero value means it.
		mode = ""
	}
	c.DetectLocalMode, c.BridgeInterface, c.InterfaceNamePrefix = mode, d.BridgeInterface, d.InterfaceNamePrefix
	return nil
}
