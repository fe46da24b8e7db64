package main

import (
	"flag"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/proxykit/proxykit/kernel"
	"github.com/proxykit/proxykit/kubeproxy"
)

// clientSettings are the clientConnection fields of a configuration file
// other than the kubeconfig; zero values leave client-go's defaults.
type clientSettings struct {
	QPS                float32
	Burst              int
	ContentType        string
	AcceptContentTypes string
}

// applyConfigFile reads o.config, a KubeProxyConfiguration
// (kubeproxy.config.k8s.io/v1alpha1) as kubeadm deploys kube-proxy with,
// into o. fs holds only the flags that apply beside a file (see
// parseOptions): as in kube-proxy, --hostname-override and -v given on
// the command line (visited in fs) win over the file. A
// field left at its zero value takes kube-proxy's default, which for a
// few fields differs from the flag's
// (an empty healthzBindAddress is the default address, where an empty
// --healthz-bind-address turns the server off; ipvs.minSyncPeriod is 0
// unless set). The fields this proxier has flags for are applied through
// the flags, so their checks apply too; the others go into o directly.
//
// It fails on a file that cannot be read, that is not a
// KubeProxyConfiguration, that has a field the type does not have or a
// value of the wrong type, or a value this proxier refuses; the error
// names the field by its path ("iptables.minSyncPeriod: ..."). kube-proxy
// only warns about unknown fields (it decodes v1alpha1 leniently when
// strict decoding fails); refusing them keeps a misspelt field from being
// silently ignored. The names
// of fields that are set but that this proxier does not implement are put
// in o.unsupported, for one warning at start-up.
func applyConfigFile(fs *flag.FlagSet, o *options) error {
	data, err := os.ReadFile(o.config)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	cfg, err := kubeproxy.Decode(data)
	if err != nil {
		return fmt.Errorf("--config %s: %w", o.config, err)
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	values, err := configValues(cfg, o)
	if err != nil {
		return fmt.Errorf("--config %s: %w", o.config, err)
	}
	for _, name := range slices.Sorted(maps.Keys(values)) {
		if given[name] {
			continue
		}
		if err := fs.Set(name, values[name].value); err != nil {
			return fmt.Errorf("--config %s: %s: %w", o.config, values[name].field, err)
		}
	}
	o.unsupported = kubeproxy.Unsupported(cfg)
	return nil
}

// flagValue is the value a configuration field gives a flag.
type flagValue struct {
	field string
	value string
}

// effectiveMode is the file's proxy mode, iptables if it names none.
func effectiveMode(cfg *kubeproxyconfig.KubeProxyConfiguration) string {
	if cfg.Mode == "" {
		return modeIPTables
	}
	return string(cfg.Mode)
}

// configValues checks the fields this proxier implements and returns
// those that have a flag as flag values (by flag name, every one that the
// file determines, defaults included); the others it puts into o.
func configValues(cfg *kubeproxyconfig.KubeProxyConfiguration, o *options) (map[string]flagValue, error) {
	v := map[string]flagValue{}
	mode := effectiveMode(cfg)
	switch mode {
	case modeIPTables, modeIPVS, modeNFTables:
	default:
		return nil, fmt.Errorf("mode: %q is not a mode this proxier has; want %q, %q or %q", cfg.Mode, modeIPTables, modeIPVS, modeNFTables)
	}
	v["mode"] = flagValue{"mode", mode}
	if cfg.ClientConnection.Kubeconfig != "" {
		v["kubeconfig"] = flagValue{"clientConnection.kubeconfig", cfg.ClientConnection.Kubeconfig}
	}
	cc := cfg.ClientConnection
	if cc.QPS < 0 {
		return nil, fmt.Errorf("clientConnection.qps: %v: must not be negative", cc.QPS)
	}
	if cc.Burst < 0 {
		return nil, fmt.Errorf("clientConnection.burst: %d: must not be negative", cc.Burst)
	}
	o.client = clientSettings{QPS: cc.QPS, Burst: int(cc.Burst), ContentType: cc.ContentType, AcceptContentTypes: cc.AcceptContentTypes}
	if cfg.HostnameOverride != "" {
		v["hostname-override"] = flagValue{"hostnameOverride", cfg.HostnameOverride}
	}

	// kube-proxy defaults both servers' addresses to bindAddress's family.
	healthz, metrics := "0.0.0.0:"+defaultHealthzPort, "127.0.0.1:"+defaultMetricsPort
	if a, err := netip.ParseAddr(cfg.BindAddress); err == nil && a.Is6() && !a.Is4In6() {
		healthz, metrics = "[::]:"+defaultHealthzPort, "[::1]:"+defaultMetricsPort
	}
	for _, s := range []struct{ flag, field, value, def, port string }{
		{"healthz-bind-address", "healthzBindAddress", cfg.HealthzBindAddress, healthz, defaultHealthzPort},
		{"metrics-bind-address", "metricsBindAddress", cfg.MetricsBindAddress, metrics, defaultMetricsPort},
	} {
		value := s.value
		if value == "" {
			value = s.def
		}
		addr, err := bindAddress(s.field, value, s.port)
		if err != nil {
			return nil, err
		}
		v[s.flag] = flagValue{s.field, addr}
	}

	prefixes, err := parseCIDRs("clusterCIDR", cfg.ClusterCIDR)
	if err != nil {
		return nil, err
	}
	if err := kubeproxy.OnePerFamily("clusterCIDR", prefixes); err != nil {
		return nil, err
	}
	if len(prefixes) > 0 {
		v["cluster-cidr"] = flagValue{"clusterCIDR", joinPrefixes(prefixes)}
	}
	if npa, err := nodePortAddressesValue(cfg.NodePortAddresses); err != nil {
		return nil, err
	} else if npa != "" {
		v["nodeport-addresses"] = flagValue{"nodePortAddresses", npa}
	}

	// kube-proxy reads masqueradeAll and masqueradeBit from the iptables
	// section in IPVS mode too, and from the nftables section in nftables
	// mode.
	masqSection, masqAll, masqBit := "iptables", cfg.IPTables.MasqueradeAll, cfg.IPTables.MasqueradeBit
	if mode == modeNFTables {
		masqSection, masqAll, masqBit = "nftables", cfg.NFTables.MasqueradeAll, cfg.NFTables.MasqueradeBit
	}
	v["masquerade-all"] = flagValue{masqSection + ".masqueradeAll", strconv.FormatBool(masqAll)}
	if b := masqBit; b != nil {
		if *b < 0 || *b > 31 {
			return nil, fmt.Errorf("%s.masqueradeBit: %d: must be within the range [0, 31]", masqSection, *b)
		}
		bit := int(*b)
		o.masqueradeBit = &bit
	}
	localhost := true
	if cfg.IPTables.LocalhostNodePorts != nil {
		localhost = *cfg.IPTables.LocalhostNodePorts
	}
	v["iptables-localhost-nodeports"] = flagValue{"iptables.localhostNodePorts", strconv.FormatBool(localhost)}

	// The sync periods are the mode's section's. kube-proxy defaults a
	// zero syncPeriod to 30s in each, and a zero minSyncPeriod to 1s in
	// the iptables and nftables sections.
	section, sync, minSync, minDefault := "iptables", cfg.IPTables.SyncPeriod.Duration, cfg.IPTables.MinSyncPeriod.Duration, time.Second
	switch mode {
	case modeIPVS:
		section, sync, minSync, minDefault = "ipvs", cfg.IPVS.SyncPeriod.Duration, cfg.IPVS.MinSyncPeriod.Duration, 0
	case modeNFTables:
		section, sync, minSync = "nftables", cfg.NFTables.SyncPeriod.Duration, cfg.NFTables.MinSyncPeriod.Duration
	}
	if sync < 0 {
		return nil, fmt.Errorf("%s.syncPeriod: %v: must be greater than 0", section, sync)
	}
	if sync == 0 {
		sync = 30 * time.Second
	}
	if minSync < 0 {
		return nil, fmt.Errorf("%s.minSyncPeriod: %v: must be greater than or equal to 0", section, minSync)
	}
	if minSync == 0 {
		minSync = minDefault
	}
	if minSync > sync {
		return nil, fmt.Errorf("%s.minSyncPeriod: %v: must not be longer than %s.syncPeriod (%v)", section, minSync, section, sync)
	}
	v["sync-period"] = flagValue{section + ".syncPeriod", sync.String()}
	v["min-sync-period"] = flagValue{section + ".minSyncPeriod", minSync.String()}

	if mode == modeIPVS && cfg.IPVS.Scheduler != "" {
		if _, err := kernel.IPVSSchedulerModule(cfg.IPVS.Scheduler); err != nil {
			return nil, fmt.Errorf("ipvs.scheduler: %w", err)
		}
		o.ipvsScheduler = cfg.IPVS.Scheduler
	}

	tuning, err := kubeproxy.ConntrackTuning(cfg.Conntrack)
	if err != nil {
		return nil, err
	}
	o.conntrack = &tuning

	if n := cfg.Logging.Verbosity; n > 0 {
		v["v"] = flagValue{"logging.verbosity", strconv.FormatUint(uint64(n), 10)}
	}
	return v, nil
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// nodePortAddressesValue turns the nodePortAddresses list into the
// --nodeport-addresses value: CIDRs, or the keyword "primary" alone (see
// kubeproxy.NodePortAddresses).
func nodePortAddressesValue(list []string) (string, error) {
	prefixes, primary, err := kubeproxy.NodePortAddresses(list)
	if primary {
		return "primary", err
	}
	return joinPrefixes(prefixes), err
}

// warnUnsupported logs, in one line, the fields of the configuration file
// that are set and that this proxier ignores; nothing when there are none.
func warnUnsupported(logger klog.Logger, o *options) {
	if len(o.unsupported) > 0 {
		logger.Info("Warning: the configuration file sets fields this proxier does not implement; they are ignored", "config", o.config, "fields", o.unsupported)
	}
}
