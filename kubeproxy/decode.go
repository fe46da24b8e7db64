package kubeproxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubeproxyconfig "k8s.io/kube-proxy/config/v1alpha1"
	k8sjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/ipvsmode"
)

// Decode decodes a KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1,
// as kubeadm deploys kube-proxy with) from YAML or JSON, strictly: empty
// data, another apiVersion or kind, a duplicate or unknown field, or a
// value of the wrong type is an error that names the field by its path
// ("iptables.minSyncPeriod: ..."). kube-proxy only warns about unknown
// fields; refusing them keeps a misspelt field from being silently
// ignored. Decode applies no default and checks no value: a field left
// out is zero.
func Decode(data []byte) (*kubeproxyconfig.KubeProxyConfiguration, error) {
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

// NodePortAddresses reads a nodePortAddresses list (or the values of
// --nodeport-addresses) as kube-proxy does: CIDRs, masked, or the keyword
// "primary" alone (the node's own addresses), or "all" (every local
// address, given as the prefixes of length 0 of both families, since no
// value means "primary" in nftables mode). An empty list gives nil and
// false. "localhost" is refused: Config.LocalhostNodePorts serves IPv4
// node ports on localhost in iptables mode. Errors name the entry
// ("nodePortAddresses[1]: ...").
func NodePortAddresses(list []string) (prefixes []netip.Prefix, primary bool, err error) {
	all := false
	for i, s := range list {
		field := fmt.Sprintf("nodePortAddresses[%d]", i)
		switch s {
		case "primary":
			primary = true
		case "all":
			all = true
		case "localhost":
			return nil, false, fmt.Errorf("%s: %q is not supported; iptables.localhostNodePorts serves IPv4 node ports on localhost in iptables mode (nftables mode never serves node ports on localhost)", field, s)
		default:
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return nil, false, fmt.Errorf("%s: want a CIDR or one of primary, all: %w", field, err)
			}
			prefixes = append(prefixes, p.Masked())
		}
	}
	switch {
	case primary && (all || len(prefixes) > 0):
		return nil, false, errors.New("nodePortAddresses: this proxier takes \"primary\" alone, not with CIDRs or \"all\"")
	case primary:
		return nil, true, nil
	case all:
		return []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}, false, nil
	}
	return prefixes, false, nil
}

// ConntrackTuning returns a configuration's conntrack section as
// conntrack.Tuning, with kube-proxy's defaults for the timeouts left unset
// (null). Unlike kube-proxy, an unset maxPerCore leaves nf_conntrack_max
// alone: it is host-wide; a maxPerCore the file sets is applied. A
// negative value is an error naming its field.
func ConntrackTuning(c kubeproxyconfig.KubeProxyConntrackConfiguration) (conntrack.Tuning, error) {
	t := conntrack.Tuning{
		TCPEstablishedTimeout: DefaultTCPEstablishedTimeout,
		TCPCloseWaitTimeout:   DefaultTCPCloseWaitTimeout,
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

// IPVSSettings returns the ipvs section's strictARP and connection
// timeouts as ipvsmode.Tuning, and its excludeCIDRs, masked, as
// kube-proxy reads them in IPVS mode. Like kube-proxy, it refuses a
// negative timeout and an excludeCIDRs entry that is not a CIDR, and
// takes a timeout in whole seconds, dropping a fraction (so that one
// under a second leaves the kernel's, as 0 does); beyond that, it refuses
// a timeout over 2^31-1 seconds, which the kernel cannot hold. Errors
// name the field ("ipvs.tcpTimeout: ...", "ipvs.excludeCIDRs[1]: ...").
// The scheduler and sync periods are read by FromConfiguration.
func IPVSSettings(c kubeproxyconfig.KubeProxyIPVSConfiguration) (ipvsmode.Tuning, []netip.Prefix, error) {
	t := ipvsmode.Tuning{StrictARP: c.StrictARP}
	for _, d := range []struct {
		field string
		value time.Duration
		into  *time.Duration
	}{
		{"ipvs.tcpTimeout", c.TCPTimeout.Duration, &t.Timeouts.TCP},
		{"ipvs.tcpFinTimeout", c.TCPFinTimeout.Duration, &t.Timeouts.TCPFin},
		{"ipvs.udpTimeout", c.UDPTimeout.Duration, &t.Timeouts.UDP},
	} {
		var err error
		if *d.into, err = IPVSTimeout(d.value); err != nil {
			return t, nil, fmt.Errorf("%s: %w", d.field, err)
		}
	}
	var cidrs []netip.Prefix
	for i, s := range c.ExcludeCIDRs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return t, nil, fmt.Errorf("ipvs.excludeCIDRs[%d]: must be a valid CIDR: %w", i, err)
		}
		cidrs = append(cidrs, p.Masked())
	}
	return t, cidrs, nil
}

// IPVSTimeout checks an IPVS connection timeout as IPVSSettings does, and
// returns it in whole seconds. The error does not name the field.
func IPVSTimeout(d time.Duration) (time.Duration, error) {
	switch {
	case d < 0:
		return 0, fmt.Errorf("%v: must be greater than or equal to 0", d)
	case d/time.Second > math.MaxInt32:
		return 0, fmt.Errorf("%v: must be at most %ds", d, math.MaxInt32)
	}
	return d.Truncate(time.Second), nil
}

func durationOrNil(d *metav1.Duration) *time.Duration {
	if d == nil {
		return nil
	}
	return &d.Duration
}

// Unsupported names the fields of cfg that are set (not at their zero
// value, or at a value that means the same as it) and that proxykit does
// not implement, in the order of the type's fields; none gives nil. The
// sections of modes other than cfg's are left out: kube-proxy does not
// read them either.
func Unsupported(cfg *kubeproxyconfig.KubeProxyConfiguration) []string {
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
		// kube-proxy takes it as the node's primary IP; proxykit takes
		// the Node object's addresses.
		out = append(out, "bindAddress")
	}
	add(cfg.EnableProfiling, "enableProfiling")
	add(cfg.ShowHiddenMetricsForVersion != "", "showHiddenMetricsForVersion")
	add(cfg.Winkernel != (kubeproxyconfig.KubeProxyWinkernelConfiguration{}), "winkernel")
	add(cfg.OOMScoreAdj != nil, "oomScoreAdj")
	add(cfg.ConfigSyncPeriod.Duration != 0, "configSyncPeriod")
	add(cfg.PortRange != "", "portRange")
	add(cfg.WindowsRunAsService, "windowsRunAsService")
	return out
}
