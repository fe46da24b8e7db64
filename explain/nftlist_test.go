package explain

import "testing"

// TestNormalizeRule: rules as nft prints them become what the writers
// write, which the tracer reads.
func TestNormalizeRule(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"meta mark set meta mark | 0x00004000", "mark set mark or 0x00004000"},
		{"meta mark set meta mark ^ 0x00004000", "mark set mark xor 0x00004000"},
		{"meta mark & 0x00004000 == 0x00000000 return", "mark and 0x00004000 == 0x00000000 return"},
		{"meta mark & 0x00004000 != 0x00000000 meta mark set meta mark ^ 0x00004000 masquerade fully-random",
			"mark and 0x00004000 != 0x00000000 mark set mark xor 0x00004000 masquerade fully-random"},
		{"ip daddr 10.96.0.1 counter packets 12 bytes 720 drop", "ip daddr 10.96.0.1 drop"},
		{"counter drop", "drop"},
		{`counter name "localhost_nps_rejected_tcp" reject`, "reject"},
		{"numgen random mod 2 vmap { 0 : goto a, 1 : goto b }", "numgen random mod 2 vmap { 0 : goto a , 1 : goto b }"},
		{"ip saddr != { 10.0.0.0/8, 10.1.0.0/16 } jump x", "ip saddr != { 10.0.0.0/8 , 10.1.0.0/16 } jump x"},
		// Untouched: what the writers write already.
		{"ip daddr . meta l4proto . th dport vmap @service-ips", "ip daddr . meta l4proto . th dport vmap @service-ips"},
		{"fib daddr type local ip daddr != 127.0.0.0/8 jump nodeports", "fib daddr type local ip daddr != 127.0.0.0/8 jump nodeports"},
	} {
		if got := normalizeRule(tc.in); got != tc.want {
			t.Errorf("normalizeRule(%q)\n got %q\nwant %q", tc.in, got, tc.want)
		}
	}
}

func TestPriorityNumber(t *testing.T) {
	for in, want := range map[string]int{"dstnat": -100, "dstnat - 10": -110, "srcnat + 5": 105, "filter": 0, "-110": -110, "mangle": -150, "raw": -300} {
		if got, err := priorityNumber(in); err != nil || got != want {
			t.Errorf("priorityNumber(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"dstnat -", "nat", "dstnat * 2"} {
		if got, err := priorityNumber(in); err == nil {
			t.Errorf("priorityNumber(%q) = %d, want an error", in, got)
		}
	}
}
