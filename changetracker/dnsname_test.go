package changetracker

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/validation"
)

// dnsNameCases are names at the edges of the DNS-1123 rules, with what
// apimachinery's regular expressions say of each.
var dnsNameCases = []struct {
	name             string
	label, subdomain bool
}{
	{"", false, false},
	{"a", true, true},
	{"0", true, true},
	{"my-name", true, true},
	{"123-abc", true, true},
	{"a--b", true, true},
	{"-a", false, false},
	{"a-", false, false},
	{"-", false, false},
	{"A", false, false},
	{"a_b", false, false},
	{"a b", false, false},
	{"a\n", false, false},
	{"\na", false, false},
	{"a\x00", false, false},
	{"é", false, false},
	{"a.b", false, true},
	{"a.b-c.d0", false, true},
	{".a", false, false},
	{"a.", false, false},
	{"a..b", false, false},
	{"a.-b", false, false},
	{"a-.b", false, false},
	{strings.Repeat("a", 63), true, true},
	{strings.Repeat("a", 64), false, true},
	{strings.Repeat("a", 253), false, true},
	{strings.Repeat("a", 254), false, false},
	{strings.Repeat("a.", 126) + "a", false, true},
	{strings.Repeat("a.", 127), false, false},
}

// TestDNS1123Names checks the trackers' own name checks, which spare the
// regular expressions for valid names, against the table and against
// apimachinery's functions, and that a refused name still gets
// apimachinery's messages.
func TestDNS1123Names(t *testing.T) {
	for _, tc := range dnsNameCases {
		got := [2]bool{isDNS1123Label(tc.name), isDNS1123Subdomain(tc.name)}
		want := [2]bool{tc.label, tc.subdomain}
		apim := [2]bool{len(validation.IsDNS1123Label(tc.name)) == 0, len(validation.IsDNS1123Subdomain(tc.name)) == 0}
		if got != want || apim != want {
			t.Errorf("%q: [label subdomain] = %v, want %v (apimachinery: %v)", tc.name, got, want, apim)
		}
		if diff := cmp.Diff(validation.IsDNS1123Label(tc.name), dns1123Label(tc.name)); diff != "" {
			t.Errorf("%q: label messages (-apimachinery +ours):\n%s", tc.name, diff)
		}
		if diff := cmp.Diff(validation.IsDNS1123Subdomain(tc.name), dns1123Subdomain(tc.name)); diff != "" {
			t.Errorf("%q: subdomain messages (-apimachinery +ours):\n%s", tc.name, diff)
		}
	}
}

// FuzzDNS1123Names checks that the trackers' name checks accept exactly
// what apimachinery's accept, so that the byte loops refuse nothing the API
// server accepts and accept nothing it refuses.
func FuzzDNS1123Names(f *testing.F) {
	for _, tc := range dnsNameCases {
		f.Add(tc.name)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := isDNS1123Label(s), len(validation.IsDNS1123Label(s)) == 0; got != want {
			t.Errorf("isDNS1123Label(%q) = %v, apimachinery says %v", s, got, want)
		}
		if got, want := isDNS1123Subdomain(s), len(validation.IsDNS1123Subdomain(s)) == 0; got != want {
			t.Errorf("isDNS1123Subdomain(%q) = %v, apimachinery says %v", s, got, want)
		}
	})
}
