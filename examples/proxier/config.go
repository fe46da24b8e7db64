package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"
	k8sjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/kernel"
)

// clientSettings are the clientConnection fields of a configuration file
// other than the kubeconfig; zero values leave client-go's defaults.
type clientSettings struct {
	QPS                float32
	Burst              int
	ContentType        string
	AcceptContentTypes string
}

// kube-proxy's conntrack defaults for the timeouts a configuration file
// leaves unset (null).
const (
	defaultTCPEstablishedTimeout = 24 * time.Hour
	defaultTCPCloseWaitTimeout   = time.Hour
)

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
	cfg, err := decodeConfig(data)
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
	o.unsupported = unsupportedFields(cfg, effectiveMode(cfg))
	return nil
}

// decodeConfig decodes a KubeProxyConfiguration strictly: a duplicate or
// unknown field, or a value of the wrong type, is an error that names the
// field's path.
func decodeConfig(data []byte) (*kubeproxyconfig.KubeProxyConfiguration, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("the file is empty")
	}
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, err
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(js, &top); err != nil {
		return nil, errors.New("want a KubeProxyConfiguration object")
	}
	cfg := &kubeproxyconfig.KubeProxyConfiguration{}
	strictErrs, err := k8sjson.UnmarshalStrict(js, cfg)
	if err != nil {
		return nil, locateDecodeError(top, nil, err)
	}
	if len(strictErrs) > 0 {
		var errs []error
		for _, e := range strictErrs {
			var fe k8sjson.FieldError
			if errors.As(e, &fe) {
				what := strings.SplitN(e.Error(), " ", 2)[0]
				errs = append(errs, fmt.Errorf("%s: %s field", fe.FieldPath(), what))
				continue
			}
			errs = append(errs, e)
		}
		return nil, errors.Join(errs...)
	}
	want := kubeproxyconfig.SchemeGroupVersion.String()
	if cfg.APIVersion != want {
		return nil, fmt.Errorf("apiVersion: %q, want %q", cfg.APIVersion, want)
	}
	if cfg.Kind != "KubeProxyConfiguration" {
		return nil, fmt.Errorf("kind: %q, want KubeProxyConfiguration", cfg.Kind)
	}
	return cfg, nil
}

// locateDecodeError finds the field whose value made decoding fail. The
// decoder names the field of a type mismatch only in Go's terms, and not
// at all when a value's own decoder (a duration, a quantity) refuses it;
// so each field under path is decoded alone, the failing one is followed
// down, and the deepest failing field is named.
func locateDecodeError(obj map[string]json.RawMessage, path []string, err error) error {
	for _, k := range slices.Sorted(maps.Keys(obj)) {
		p := append(slices.Clone(path), k)
		_, e := k8sjson.UnmarshalStrict(nest(p, obj[k]), &kubeproxyconfig.KubeProxyConfiguration{})
		if e == nil {
			continue
		}
		err = e
		var child map[string]json.RawMessage
		if json.Unmarshal(obj[k], &child) == nil && len(child) > 0 {
			return locateDecodeError(child, p, err)
		}
		field, value := strings.Join(p, "."), obj[k]
		var items []json.RawMessage
		if json.Unmarshal(obj[k], &items) == nil {
			for i, item := range items {
				if _, e := k8sjson.UnmarshalStrict(nest(p, append(append([]byte("["), item...), ']')), &kubeproxyconfig.KubeProxyConfiguration{}); e != nil {
					field, value, err = fmt.Sprintf("%s[%d]", field, i), item, e
					break
				}
			}
		}
		return fmt.Errorf("%s: %s", field, describeDecodeError(value, err))
	}
	if len(path) == 0 {
		return err
	}
	return fmt.Errorf("%s: %w", strings.Join(path, "."), err)
}

// nest wraps value in one object per element of path.
func nest(path []string, value json.RawMessage) []byte {
	var b bytes.Buffer
	for _, k := range path {
		key, _ := json.Marshal(k)
		b.WriteByte('{')
		b.Write(key)
		b.WriteByte(':')
	}
	b.Write(value)
	for range path {
		b.WriteByte('}')
	}
	return b.Bytes()
}

var typeMismatch = regexp.MustCompile(`cannot unmarshal (\w+)(?: \S+)? into .* of type (\S+)$`)

// describeDecodeError says what was wrong with value in the file's terms.
func describeDecodeError(value json.RawMessage, err error) string {
	if m := typeMismatch.FindStringSubmatch(err.Error()); m != nil {
		return fmt.Sprintf("%s is a %s, want %s", value, m[1], m[2])
	}
	return fmt.Sprintf("%s: %v", value, err)
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
	if err := onePerFamily("clusterCIDR", prefixes); err != nil {
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

	tuning, err := conntrackTuning(cfg.Conntrack)
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
// --nodeport-addresses value: CIDRs, or the keyword "primary" alone. The
// keyword "all" means every local address: it is given as the prefixes of
// length 0, since no value means "primary" in nftables mode.
func nodePortAddressesValue(list []string) (string, error) {
	var cidrs []string
	primary, all := false, false
	for i, s := range list {
		field := fmt.Sprintf("nodePortAddresses[%d]", i)
		switch s {
		case "primary":
			primary = true
		case "all":
			all = true
		case "localhost":
			return "", fmt.Errorf("%s: %q is not supported; iptables.localhostNodePorts serves IPv4 node ports on localhost in iptables mode (nftables mode never serves node ports on localhost)", field, s)
		default:
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return "", fmt.Errorf("%s: want a CIDR or one of primary, all: %w", field, err)
			}
			cidrs = append(cidrs, p.Masked().String())
		}
	}
	switch {
	case primary && (all || len(cidrs) > 0):
		return "", errors.New("nodePortAddresses: this proxier takes \"primary\" alone, not with CIDRs or \"all\"")
	case primary:
		return "primary", nil
	case all:
		return "0.0.0.0/0,::/0", nil
	}
	return strings.Join(cidrs, ","), nil
}

// conntrackTuning returns the conntrack section as conntrack.Tuning, with
// kube-proxy's defaults for the timeouts left unset. Unlike kube-proxy, an
// unset maxPerCore leaves nf_conntrack_max alone: it is host-wide (see
// tuneConntrack); a maxPerCore the file sets is applied.
func conntrackTuning(c kubeproxyconfig.KubeProxyConntrackConfiguration) (conntrack.Tuning, error) {
	t := conntrack.Tuning{
		TCPEstablishedTimeout: defaultTCPEstablishedTimeout,
		TCPCloseWaitTimeout:   defaultTCPCloseWaitTimeout,
		TCPBeLiberal:          c.TCPBeLiberal,
	}
	if c.MaxPerCore != nil {
		if *c.MaxPerCore < 0 {
			return t, fmt.Errorf("conntrack.maxPerCore: %d: must be greater than or equal to 0", *c.MaxPerCore)
		}
		t.MaxPerCore = int(*c.MaxPerCore)
	}
	if c.Min != nil {
		if *c.Min < 0 {
			return t, fmt.Errorf("conntrack.min: %d: must be greater than or equal to 0", *c.Min)
		}
		t.Min = int(*c.Min)
	}
	for _, d := range []struct {
		field string
		value *time.Duration
		into  *time.Duration
	}{
		{"conntrack.tcpEstablishedTimeout", durationOrNil(c.TCPEstablishedTimeout), &t.TCPEstablishedTimeout},
		{"conntrack.tcpCloseWaitTimeout", durationOrNil(c.TCPCloseWaitTimeout), &t.TCPCloseWaitTimeout},
		{"conntrack.udpTimeout", &c.UDPTimeout.Duration, &t.UDPTimeout},
		{"conntrack.udpStreamTimeout", &c.UDPStreamTimeout.Duration, &t.UDPStreamTimeout},
	} {
		if d.value == nil {
			continue
		}
		if *d.value < 0 {
			return t, fmt.Errorf("%s: %v: must be greater than or equal to 0", d.field, *d.value)
		}
		*d.into = *d.value
	}
	return t, nil
}

// warnUnsupported logs, in one line, the fields of the configuration file
// that are set and that this proxier ignores; nothing when there are none.
func warnUnsupported(logger klog.Logger, o *options) {
	if len(o.unsupported) > 0 {
		logger.Info("Warning: the configuration file sets fields this proxier does not implement; they are ignored", "config", o.config, "fields", o.unsupported)
	}
}

func durationOrNil(d *metav1.Duration) *time.Duration {
	if d == nil {
		return nil
	}
	return &d.Duration
}

// unsupportedFields names the fields of cfg that are set (not at their
// zero value, or at a value that means the same as it) and that this
// proxier does not implement, in the order of the type's fields. The sections of modes
// other than mode are left out: kube-proxy does not read them either.
func unsupportedFields(cfg *kubeproxyconfig.KubeProxyConfiguration, mode string) []string {
	var out []string
	add := func(set bool, field string) {
		if set {
			out = append(out, field)
		}
	}
	add(len(cfg.FeatureGates) > 0, "featureGates")
	l := cfg.Logging
	add(l.Format != "" && l.Format != "text", "logging.format")
	add(l.FlushFrequency.Duration.Duration != 0, "logging.flushFrequency")
	add(len(l.VModule) > 0, "logging.vmodule")
	add(l.Options.Text.SplitStream || !l.Options.Text.InfoBufferSize.IsZero(), "logging.options.text")
	add(l.Options.JSON.SplitStream || !l.Options.JSON.InfoBufferSize.IsZero(), "logging.options.json")
	if a, err := netip.ParseAddr(cfg.BindAddress); cfg.BindAddress != "" && (err != nil || !a.IsUnspecified()) {
		// kube-proxy takes it as the node's primary IP; this proxier
		// takes the Node object's addresses.
		out = append(out, "bindAddress")
	}
	add(cfg.EnableProfiling, "enableProfiling")
	add(cfg.ShowHiddenMetricsForVersion != "", "showHiddenMetricsForVersion")
	if mode == modeIPVS {
		i := cfg.IPVS
		add(len(i.ExcludeCIDRs) > 0, "ipvs.excludeCIDRs")
		add(i.StrictARP, "ipvs.strictARP")
		add(i.TCPTimeout.Duration != 0, "ipvs.tcpTimeout")
		add(i.TCPFinTimeout.Duration != 0, "ipvs.tcpFinTimeout")
		add(i.UDPTimeout.Duration != 0, "ipvs.udpTimeout")
	}
	add(cfg.Winkernel != (kubeproxyconfig.KubeProxyWinkernelConfiguration{}), "winkernel")
	add(cfg.DetectLocalMode != "" && cfg.DetectLocalMode != "ClusterCIDR", "detectLocalMode")
	add(cfg.DetectLocal != (kubeproxyconfig.DetectLocalConfiguration{}), "detectLocal")
	add(cfg.OOMScoreAdj != nil, "oomScoreAdj")
	add(cfg.ConfigSyncPeriod.Duration != 0, "configSyncPeriod")
	add(cfg.PortRange != "", "portRange")
	add(cfg.WindowsRunAsService, "windowsRunAsService")
	return out
}

// ipvsSchedulers returns the IPVS schedulers whose modules IPVS mode
// needs: none for the default, else ipvs.scheduler's.
func (o *options) ipvsSchedulers() []string {
	if o.ipvsScheduler == "" {
		return nil
	}
	return []string{o.ipvsScheduler}
}
