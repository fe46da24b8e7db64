package kernel

import (
	"fmt"
	"strings"
	"testing"
	"unicode"

	"github.com/google/go-cmp/cmp"
)

// The parsers read files a node's kernel, distribution or container runtime
// wrote; whatever they hold, parsing must not panic and must keep these
// properties. Seeds are in testdata/fuzz.

func FuzzParseVersion(f *testing.F) {
	for _, s := range []string{"6.1.0-56-cloud-amd64", "3.10.0-957.1.3.el7.x86_64", "6.18.44-fc-v669\n", "4.19", "4.19.", "5.4.0+", "", "6"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := ParseVersion(s)
		if err != nil {
			return
		}
		if v.Major < 0 || v.Minor < 0 || v.Patch < 0 {
			t.Fatalf("ParseVersion(%q) = %+v: negative number", s, v)
		}
		if v.Release != strings.TrimSpace(s) {
			t.Fatalf("ParseVersion(%q).Release = %q, want the trimmed input", s, v.Release)
		}
		again, err := ParseVersion(v.String())
		if err != nil || again != v {
			t.Fatalf("reparsing %q: %+v, %v; want %+v", v.String(), again, err, v)
		}
		plain, err := ParseVersion(fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch))
		if err != nil || plain.Compare(v) != 0 {
			t.Fatalf("numeric part of %q reparses as %+v, %v", s, plain, err)
		}
	})
}

func FuzzParseModules(f *testing.F) {
	f.Add([]byte("nf_conntrack 188416 2 nf_nat,xt_conntrack, Live 0x0000000000000000\nip_vs 16384 0 - Live 0x0\n"))
	f.Add([]byte("nvidia-drm 69632 0 - Live 0x0 (POE)\n\n  \n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		mods := ParseModules(data)
		if len(mods) > strings.Count(string(data), "\n")+1 {
			t.Fatalf("%d modules from %d lines", len(mods), strings.Count(string(data), "\n")+1)
		}
		var rendered strings.Builder
		for _, m := range mods {
			if m == "" || strings.ContainsFunc(m, unicode.IsSpace) || strings.Contains(m, "-") {
				t.Fatalf("bad module name %q", m)
			}
			fmt.Fprintf(&rendered, "%s 16384 0 - Live 0x0\n", m)
		}
		if diff := cmp.Diff(mods, ParseModules([]byte(rendered.String()))); diff != "" {
			t.Fatalf("modules do not survive a round trip (-first +second):\n%s", diff)
		}
	})
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("CONFIG_NETFILTER=y\n# CONFIG_IP_VS is not set\nCONFIG_CC_VERSION_TEXT=\"gcc (GCC) 15.3.0\"\n"))
	f.Add([]byte("#\n# comment\n\nCONFIG_=y\nCONFIG_A B=y\n  CONFIG_X=m  \r\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		c := ParseConfig(data)
		var rendered strings.Builder
		for name, value := range c {
			if !validConfigName(name) {
				t.Fatalf("bad symbol %q", name)
			}
			if strings.ContainsAny(value, "\n") {
				t.Fatalf("%s has a multi-line value %q", name, value)
			}
			if value == "n" {
				fmt.Fprintf(&rendered, "# %s is not set\n", name)
			} else {
				fmt.Fprintf(&rendered, "%s=%s\n", name, value)
			}
			// BuiltIn must agree with the map for modules named after
			// their symbol (upper case, as Kconfig symbols are).
			module := strings.ToLower(strings.TrimPrefix(name, "CONFIG_"))
			_, exception := configSymbolExceptions[module]
			if name == strings.ToUpper(name) && !exception && !strings.HasPrefix(module, "xt_") {
				if got := c.BuiltIn(module); got != (value == "y") {
					t.Fatalf("BuiltIn(%q) = %v with %s=%q", module, got, name, value)
				}
			}
		}
		if diff := cmp.Diff(c, ParseConfig([]byte(rendered.String()))); diff != "" {
			t.Fatalf("config does not survive a round trip (-first +second):\n%s", diff)
		}
	})
}
