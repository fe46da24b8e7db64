package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// effectiveConfig is the KubeProxyConfiguration (v1alpha1) that o runs
// with, whether it came from flags or a file: read back with --config, it
// gives the same options. The sync periods and masquerading are written
// to the running mode's section, where kube-proxy reads them. Two values
// cannot be told apart from the defaults in a file, for kube-proxy as for
// this proxier, and read back as the defaults: a server turned off (an
// empty address) and an iptables or nftables minSyncPeriod of 0.
func effectiveConfig(o *options) *kubeproxyconfig.KubeProxyConfiguration {
	cfg := &kubeproxyconfig.KubeProxyConfiguration{
		TypeMeta:           metav1.TypeMeta{APIVersion: kubeproxyconfig.SchemeGroupVersion.String(), Kind: "KubeProxyConfiguration"},
		HostnameOverride:   o.hostnameOverride,
		BindAddress:        "0.0.0.0",
		HealthzBindAddress: o.healthzBindAddress,
		MetricsBindAddress: o.metricsBindAddress,
		Mode:               kubeproxyconfig.ProxyMode(o.mode),
		ClusterCIDR:        joinPrefixes(o.clusterCIDRs),
		DetectLocalMode:    "ClusterCIDR",
	}
	cfg.Logging.Verbosity = logsapi.VerbosityLevel(o.verbosity)
	cc := &cfg.ClientConnection
	cc.Kubeconfig, cc.QPS, cc.Burst = o.kubeconfig, o.client.QPS, int32(o.client.Burst)
	cc.ContentType, cc.AcceptContentTypes = o.client.ContentType, o.client.AcceptContentTypes

	localhost := o.localhostNodePorts
	cfg.IPTables.LocalhostNodePorts = &localhost
	sync, minSync := metav1.Duration{Duration: o.syncPeriod}, metav1.Duration{Duration: o.minSyncPeriod}
	var bit *int32
	if o.masqueradeBit != nil {
		b := int32(*o.masqueradeBit)
		bit = &b
	}
	switch o.mode {
	case modeNFTables:
		n := &cfg.NFTables
		n.SyncPeriod, n.MinSyncPeriod, n.MasqueradeAll, n.MasqueradeBit = sync, minSync, o.masqueradeAll, bit
	case modeIPVS:
		cfg.IPVS.SyncPeriod, cfg.IPVS.MinSyncPeriod, cfg.IPVS.Scheduler = sync, minSync, o.ipvsScheduler
		// IPVS mode masquerades as the iptables section says.
		cfg.IPTables.MasqueradeAll, cfg.IPTables.MasqueradeBit = o.masqueradeAll, bit
	default:
		i := &cfg.IPTables
		i.SyncPeriod, i.MinSyncPeriod, i.MasqueradeAll, i.MasqueradeBit = sync, minSync, o.masqueradeAll, bit
	}

	switch {
	case o.nodePortPrimary:
		cfg.NodePortAddresses = []string{"primary"}
	case len(o.nodePortAddresses) > 0:
		cfg.NodePortAddresses = strings.Split(joinPrefixes(o.nodePortAddresses), ",")
	}

	t := o.conntrack
	if t == nil {
		return cfg
	}
	ct := &cfg.Conntrack
	// A maxPerCore of 0 or none leaves nf_conntrack_max alone.
	if t.MaxPerCore > 0 {
		maxPerCore, minimum := int32(t.MaxPerCore), int32(t.Min)
		ct.MaxPerCore, ct.Min = &maxPerCore, &minimum
	}
	duration := func(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }
	ct.TCPEstablishedTimeout, ct.TCPCloseWaitTimeout = duration(t.TCPEstablishedTimeout), duration(t.TCPCloseWaitTimeout)
	ct.TCPBeLiberal = t.TCPBeLiberal
	ct.UDPTimeout, ct.UDPStreamTimeout = *duration(t.UDPTimeout), *duration(t.UDPStreamTimeout)
	return cfg
}

// writeConfigFile is --write-config-to: it writes effectiveConfig(o) as
// YAML to o.writeConfigTo, as kube-proxy writes its configuration there.
func writeConfigFile(o *options) error {
	data, err := yaml.Marshal(effectiveConfig(o))
	if err != nil {
		return fmt.Errorf("--write-config-to: %w", err)
	}
	if err := os.WriteFile(o.writeConfigTo, data, 0o644); err != nil {
		return fmt.Errorf("--write-config-to: %w", err)
	}
	return nil
}
