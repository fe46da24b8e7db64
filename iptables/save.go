package iptables

import "bytes"

// ChainsFromSave returns the chains declared (":CHAIN POLICY [p:b]") in
// iptables-save output, in the order they appear. It does not look at
// which table they belong to; give it the output of one table, such as
// [Interface.SaveInto] writes. Malformed lines are skipped.
func ChainsFromSave(save []byte) []Chain {
	var chains []Chain
	for len(save) > 0 {
		line := save
		if i := bytes.IndexByte(save, '\n'); i >= 0 {
			line, save = save[:i], save[i+1:]
		} else {
			save = nil
		}
		if len(line) < 2 || line[0] != ':' {
			continue
		}
		name := line[1:]
		if i := bytes.IndexAny(name, " \t\r"); i >= 0 {
			name = name[:i]
		}
		if len(name) > 0 {
			chains = append(chains, Chain(name))
		}
	}
	return chains
}
