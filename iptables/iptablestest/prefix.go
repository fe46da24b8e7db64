package iptablestest

import "strings"

// PrefixLines returns the lines of dump (a [Fake.Dump], or any other
// line-oriented dump such as an ipset fake's) that name something starting
// with prefix and a dash: with a chain prefix (iptables.ChainNames), the
// chains of one proxy, their rules and the jumps to them from built-in
// chains. Tests of proxies that share tables compare one proxy's lines
// before and after the other acts. It returns nil when no line does.
func PrefixLines(dump, prefix string) []string {
	var out []string
	for l := range strings.Lines(dump) {
		if strings.Contains(l, prefix+"-") {
			out = append(out, l)
		}
	}
	return out
}
