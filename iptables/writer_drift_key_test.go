package iptables

import "testing"

// TestParseRuleKey checks that a rule as the writer writes it and as
// iptables -S prints it back give the same key, whatever the quoting.
func TestParseRuleKey(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want ruleKey
		ok   bool
	}{
		{
			spec: ` -m comment --comment "ns/web:http cluster IP" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j KUBE-SVC-ABC`,
			want: ruleKey{comment: "ns/web:http cluster IP", target: "KUBE-SVC-ABC"}, ok: true,
		},
		{
			// As iptables -S prints it: other order, prefix length.
			spec: `-d 10.96.0.10/32 -p tcp -m comment --comment "ns/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-ABC`,
			want: ruleKey{comment: "ns/web:http cluster IP", target: "KUBE-SVC-ABC"}, ok: true,
		},
		{
			spec: ` -m comment --comment ns/np:http -m tcp -p tcp --dport 30080 -j KUBE-EXT-ABC`,
			want: ruleKey{comment: "ns/np:http", target: "KUBE-EXT-ABC"}, ok: true,
		},
		{
			spec: `-m comment --comment "say \"hi\" \\ there" -p tcp -j REJECT --reject-with icmp-port-unreachable`,
			want: ruleKey{comment: `say "hi" \ there`, target: "REJECT"}, ok: true,
		},
		{spec: `-s 10.0.0.1/32 -g KUBE-MARK-MASQ`, want: ruleKey{target: "KUBE-MARK-MASQ"}, ok: true},
		{spec: `-m comment --comment "no target"`, want: ruleKey{comment: "no target"}},
		{spec: ``},
		{spec: `--comment "unterminated -j X`, want: ruleKey{comment: "unterminated -j X"}},
	} {
		got, ok := parseRuleKey(natServices, tc.spec)
		tc.want.chain = natServices
		if ok != tc.ok || got != tc.want {
			t.Errorf("parseRuleKey(%q) = %+v, %v; want %+v, %v", tc.spec, got, ok, tc.want, tc.ok)
		}
	}
}
