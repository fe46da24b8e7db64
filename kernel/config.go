package kernel

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
)

// procConfigGz is where a kernel built with CONFIG_IKCONFIG_PROC exposes its
// own build configuration.
const procConfigGz = "/proc/config.gz"

// maxConfigSize bounds how much of a decompressed kernel config is read; a
// real one is a few hundred kilobytes.
const maxConfigSize = 16 << 20

// Config is a kernel build configuration: each CONFIG_ symbol mapped to its
// value as the config file writes it ("y" for built in, "m" for a loadable
// module, a number, or a quoted string), and to "n" for a symbol the file
// says "is not set". A symbol that is absent is unknown, which for modules
// means not available.
type Config map[string]string

// ParseConfig parses the text of a kernel config (/boot/config-<release>, or
// /proc/config.gz decompressed). It is lenient: blank lines, comments and
// anything that is not a CONFIG_NAME=value or "# CONFIG_NAME is not set"
// line are skipped, and a later line overrides an earlier one, as in
// Kconfig. It never fails; an empty input gives an empty Config.
func ParseConfig(data []byte) Config {
	c := Config{}
	for len(data) > 0 {
		var line []byte
		line, data, _ = bytes.Cut(data, []byte{'\n'})
		s := strings.TrimSpace(string(line))
		if rest, ok := strings.CutPrefix(s, "#"); ok {
			name, ok := strings.CutSuffix(strings.TrimSpace(rest), " is not set")
			if ok && validConfigName(name) {
				c[name] = "n"
			}
			continue
		}
		name, value, ok := strings.Cut(s, "=")
		if ok && validConfigName(name) {
			c[name] = value
		}
	}
	return c
}

// validConfigName reports whether s is CONFIG_ followed by one or more
// letters, digits or underscores.
func validConfigName(s string) bool {
	rest, ok := strings.CutPrefix(s, "CONFIG_")
	if !ok || rest == "" {
		return false
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// BuiltIn reports whether the config builds module into the kernel image
// (=y). It knows the config symbols of the netfilter, conntrack, ipset, IPVS
// and bridge modules a proxy uses; for other names it tries the module name
// in upper case (ip_vs_mh → CONFIG_IP_VS_MH), which is the kernel's usual
// convention. It returns false for a module built as =m, not set, or
// unknown.
func (c Config) BuiltIn(module string) bool {
	for _, sym := range configSymbols(normalizeModule(module)) {
		if c[sym] == "y" {
			return true
		}
	}
	return false
}

// configSymbolExceptions maps modules whose config symbol is not their
// upper-cased name.
var configSymbolExceptions = map[string]string{
	"br_netfilter":         "CONFIG_BRIDGE_NETFILTER",
	"ip_tables":            "CONFIG_IP_NF_IPTABLES",
	"ip6_tables":           "CONFIG_IP6_NF_IPTABLES",
	"iptable_filter":       "CONFIG_IP_NF_FILTER",
	"iptable_nat":          "CONFIG_IP_NF_NAT",
	"iptable_mangle":       "CONFIG_IP_NF_MANGLE",
	"iptable_raw":          "CONFIG_IP_NF_RAW",
	"ip6table_filter":      "CONFIG_IP6_NF_FILTER",
	"ip6table_nat":         "CONFIG_IP6_NF_NAT",
	"ip6table_mangle":      "CONFIG_IP6_NF_MANGLE",
	"ip6table_raw":         "CONFIG_IP6_NF_RAW",
	"ipt_reject":           "CONFIG_IP_NF_TARGET_REJECT",
	"ip6t_reject":          "CONFIG_IP6_NF_TARGET_REJECT",
	"nfnetlink":            "CONFIG_NETFILTER_NETLINK",
	"nf_conntrack_netlink": "CONFIG_NF_CT_NETLINK",
	"x_tables":             "CONFIG_NETFILTER_XTABLES",
}

// configSymbols returns the config symbols that may build module, most
// likely first.
func configSymbols(module string) []string {
	if sym, ok := configSymbolExceptions[strings.ToLower(module)]; ok {
		return []string{sym}
	}
	upper := strings.ToUpper(module)
	if rest, ok := strings.CutPrefix(upper, "XT_"); ok {
		// xt_conntrack is a match, xt_MASQUERADE a target, xt_set and
		// xt_nat neither; the module name does not say which.
		return []string{
			"CONFIG_NETFILTER_XT_MATCH_" + rest,
			"CONFIG_NETFILTER_XT_TARGET_" + rest,
			"CONFIG_NETFILTER_XT_" + rest,
		}
	}
	return []string{"CONFIG_" + upper}
}

// Config returns the build configuration of the running kernel (release v)
// and the path it came from: /boot/config-<release> if it exists, else
// /proc/config.gz. It returns an error wrapping fs.ErrNotExist when neither
// exists, and an error naming the file when one cannot be read or
// decompressed.
func (k *Kernel) Config(v Version) (Config, string, error) {
	bootConfig := "/boot/config-" + v.Release
	if v.Release == "" || strings.Contains(v.Release, "/") {
		bootConfig = ""
	}
	if bootConfig != "" {
		data, err := k.readFile(bootConfig)
		if err == nil {
			return ParseConfig(data), bootConfig, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, "", err
		}
	}
	gz, err := k.readFile(procConfigGz)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", fmt.Errorf("no kernel config for %s: neither %s nor %s exists: %w", v, bootConfig, procConfigGz, fs.ErrNotExist)
	}
	if err != nil {
		return nil, "", err
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, "", fmt.Errorf("reading %s: %w", procConfigGz, err)
	}
	data, err := io.ReadAll(io.LimitReader(zr, maxConfigSize))
	if err != nil {
		return nil, "", fmt.Errorf("reading %s: %w", procConfigGz, err)
	}
	return ParseConfig(data), procConfigGz, nil
}
