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

	"k8s.io/klog/v2"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"

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

// configValues checks the fields this proxier implements (see
// kubeproxy.FromConfiguration) and returns those that have a flag as flag
// values (by flag name, every one that the file determines, defaults
// included); the others it puts into o.
func configValues(cfg *kubeproxyconfig.KubeProxyConfiguration, o *options) (map[string]flagValue, error) {
	c, err := kubeproxy.FromConfiguration(cfg)
	if err != nil {
		return nil, err
	}
	v := map[string]flagValue{
		"mode":                 {"mode", c.Mode},
		"healthz-bind-address": {"healthzBindAddress", c.HealthzBindAddress},
		"metrics-bind-address": {"metricsBindAddress", c.MetricsBindAddress},
		// The sections kube-proxy reads these from in the file's mode.
		"masquerade-all":               {masqueradeSection(c.Mode) + ".masqueradeAll", strconv.FormatBool(c.MasqueradeAll)},
		"iptables-localhost-nodeports": {"iptables.localhostNodePorts", strconv.FormatBool(c.LocalhostNodePorts)},
		"sync-period":                  {syncSection(c.Mode) + ".syncPeriod", c.SyncPeriod.String()},
		"min-sync-period":              {syncSection(c.Mode) + ".minSyncPeriod", c.MinSyncPeriod.String()},
	}
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
	if len(c.ClusterCIDRs) > 0 {
		v["cluster-cidr"] = flagValue{"clusterCIDR", joinPrefixes(c.ClusterCIDRs)}
	}
	// Only what the file gives: the flag's absence is nftables mode's
	// default too.
	if len(cfg.NodePortAddresses) > 0 {
		npa := joinPrefixes(c.NodePortAddresses)
		if c.NodePortPrimary {
			npa = "primary"
		}
		v["nodeport-addresses"] = flagValue{"nodePortAddresses", npa}
	}
	o.masqueradeBit, o.ipvsScheduler, o.conntrack = c.MasqueradeBit, c.IPVSScheduler, c.Conntrack
	o.ipvsExcludeCIDRs, o.ipvsTuning = c.IPVSExcludeCIDRs, c.IPVSTuning
	o.detectLocalMode, o.bridgeInterface, o.interfaceNamePrefix = c.DetectLocalMode, c.BridgeInterface, c.InterfaceNamePrefix
	if n := cfg.Logging.Verbosity; n > 0 {
		v["v"] = flagValue{"logging.verbosity", strconv.FormatUint(uint64(n), 10)}
	}
	return v, nil
}

// masqueradeSection is the section kube-proxy reads masqueradeAll and
// masqueradeBit from in mode: the iptables one in IPVS mode too.
func masqueradeSection(mode string) string {
	if mode == modeNFTables {
		return "nftables"
	}
	return "iptables"
}

// syncSection is the section kube-proxy reads the sync periods from in
// mode.
func syncSection(mode string) string {
	if mode == modeIPTables {
		return "iptables"
	}
	return mode
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
		// An error line, not an info one, so that a DaemonSet's log does
		// not bury it: the node runs without what these fields ask for.
		logger.Error(nil, "Warning: the configuration file sets fields this proxier does not implement; they are ignored", "config", o.config, "fields", o.unsupported)
	}
}
