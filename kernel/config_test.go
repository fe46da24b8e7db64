package kernel

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseConfig(t *testing.T) {
	in := `#
# Automatically generated file; DO NOT EDIT.
# Linux/x86 6.18.44 Kernel Configuration
#
CONFIG_CC_VERSION_TEXT="gcc (GCC) 15.3.0"
CONFIG_NETFILTER=y
CONFIG_IP_SET_MAX=256
CONFIG_IP_VS=m
# CONFIG_MODULES is not set
#CONFIG_TIGHT is not set
  CONFIG_INDENTED=y  
CONFIG_IP_VS=y
CONFIG_=y
CONFIG_BAD NAME=y
NOT_CONFIG=y
# Some comment
garbage line`
	want := Config{
		"CONFIG_CC_VERSION_TEXT": `"gcc (GCC) 15.3.0"`,
		"CONFIG_NETFILTER":       "y",
		"CONFIG_IP_SET_MAX":      "256",
		"CONFIG_IP_VS":           "y", // the later line wins
		"CONFIG_MODULES":         "n",
		"CONFIG_TIGHT":           "n",
		"CONFIG_INDENTED":        "y",
	}
	if diff := cmp.Diff(want, ParseConfig([]byte(in))); diff != "" {
		t.Errorf("ParseConfig (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(Config{}, ParseConfig(nil)); diff != "" {
		t.Errorf("ParseConfig(nil) (-want +got):\n%s", diff)
	}
}

func TestConfigBuiltIn(t *testing.T) {
	c := Config{
		"CONFIG_BRIDGE_NETFILTER":               "y",
		"CONFIG_NETFILTER_XT_SET":               "y",
		"CONFIG_NETFILTER_XT_MATCH_COMMENT":     "y",
		"CONFIG_NETFILTER_XT_TARGET_MASQUERADE": "y",
		"CONFIG_NETFILTER_XT_NAT":               "y",
		"CONFIG_IP_NF_IPTABLES":                 "y",
		"CONFIG_IP_NF_TARGET_REJECT":            "y",
		"CONFIG_IP_VS":                          "m",
		"CONFIG_IP_VS_RR":                       "n",
		"CONFIG_NF_CONNTRACK":                   "y",
	}
	for module, want := range map[string]bool{
		"br_netfilter":  true,
		"br-netfilter":  true,
		"xt_set":        true,
		"xt_comment":    true,
		"xt_MASQUERADE": true,
		"xt_nat":        true,
		"ip_tables":     true,
		"ipt_REJECT":    true,
		"nf_conntrack":  true,
		"ip_vs":         false, // =m is not built in
		"ip_vs_rr":      false,
		"ip_vs_sh":      false, // absent
	} {
		if got := c.BuiltIn(module); got != want {
			t.Errorf("BuiltIn(%q) = %v, want %v", module, got, want)
		}
	}
	var nilConfig Config
	if nilConfig.BuiltIn("nf_conntrack") {
		t.Error("a nil Config says nf_conntrack is built in")
	}
}

func TestKernelConfigSources(t *testing.T) {
	v := Version{Major: 6, Minor: 1, Release: "6.1.0-56-cloud-amd64"}
	for _, tc := range []struct {
		name     string
		files    map[string]string
		wantPath string
		wantIPVS string
		wantErr  bool
	}{
		{
			name: "boot config wins over config.gz",
			files: map[string]string{
				"/boot/config-6.1.0-56-cloud-amd64": "CONFIG_IP_VS=m\n",
				procConfigGz:                        gzipped(t, "CONFIG_IP_VS=y\n"),
			},
			wantPath: "/boot/config-6.1.0-56-cloud-amd64", wantIPVS: "m",
		},
		{
			name:     "config.gz when no boot config",
			files:    map[string]string{procConfigGz: gzipped(t, "CONFIG_IP_VS=y\n")},
			wantPath: procConfigGz, wantIPVS: "y",
		},
		{
			name:  "boot config of another release is ignored",
			files: map[string]string{"/boot/config-5.10.0": "CONFIG_IP_VS=y\n"}, wantErr: true,
		},
		{name: "neither", files: map[string]string{}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := &Kernel{Root: writeTree(t, tc.files)}
			c, p, err := k.Config(v)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Config() error = %v, want error %v", err, tc.wantErr)
			}
			if p != tc.wantPath || c["CONFIG_IP_VS"] != tc.wantIPVS {
				t.Errorf("Config() = path %q IP_VS %q, want %q %q", p, c["CONFIG_IP_VS"], tc.wantPath, tc.wantIPVS)
			}
		})
	}
}
