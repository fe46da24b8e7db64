package explain

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strings"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
)

// The modes a Ruleset can be of, as --mode names them.
const (
	ModeIPTables = "iptables"
	ModeNFTables = "nftables"
)

// Ruleset is the service rules of one IP family of one node, in one mode,
// held in memory so that packets can be traced through them: read from
// the kernel (ReadKernel), parsed from a tool's output (IPTablesRuleset,
// NFTablesRuleset) or from a dry run's (ParseDryRun). It is safe for
// concurrent use; nothing changes it after it is made.
type Ruleset struct {
	mode   string
	family v1.IPFamily
	// ipt holds the tables in iptables mode; prefix is the chain prefix
	// of the proxy whose chains a drift compares.
	ipt    *iptablestest.Fake
	prefix string
	// nft holds the table in nftables mode.
	nft   *knftables.Fake
	table string
}

// Mode returns ModeIPTables or ModeNFTables.
func (r *Ruleset) Mode() string { return r.mode }

// Family returns the IP family of the rules.
func (r *Ruleset) Family() v1.IPFamily { return r.family }

// IPTablesRuleset returns the Ruleset of save, the output of iptables-save
// (or ip6tables-save for IPv6) of one or more tables, usually nat and
// filter. Rules of other programs are kept: a packet goes through them as
// through the proxy's. chainPrefix is the prefix of the proxy's chains
// ("" means iptables.DefaultChainPrefix, kube-proxy's KUBE), which only
// Compare reads. It fails, naming the line, on anything the iptables fake
// refuses, such as a match it does not know; a "-m set" match is taken to
// name a set that exists, whose content Trace assumes both ways.
func IPTablesRuleset(family v1.IPFamily, save []byte, chainPrefix string) (*Ruleset, error) {
	if chainPrefix == "" {
		chainPrefix = iptables.DefaultChainPrefix
	}
	if _, err := iptables.NewChainNames(chainPrefix); err != nil {
		return nil, err
	}
	f, err := newIPTablesFake(family)
	if err != nil {
		return nil, err
	}
	if err := f.ParseDump(string(save)); err != nil {
		return nil, fmt.Errorf("reading %s rules: %w", saveCommand(family), err)
	}
	return &Ruleset{mode: ModeIPTables, family: family, ipt: f, prefix: chainPrefix}, nil
}

func newIPTablesFake(family v1.IPFamily) (*iptablestest.Fake, error) {
	// Any set exists: the live rules name the node's sets, whose content
	// the trace does not know and assumes both ways.
	opt := iptablestest.WithIPSets(func(string) bool { return true })
	switch family {
	case v1.IPv4Protocol:
		return iptablestest.NewFake(opt), nil
	case v1.IPv6Protocol:
		return iptablestest.NewIPv6Fake(opt), nil
	}
	return nil, fmt.Errorf("unknown IP family %q", family)
}

// NFTablesRuleset returns the Ruleset of listing, the output of
// `nft list table ip|ip6 TABLE` (kube-proxy's table is "kube-proxy"). The
// elements of dynamic sets (session affinity) are left out: a traced
// packet is a client's first. Counters are left out. It fails, naming the
// line, on a listing it cannot read, or of another table or family.
func NFTablesRuleset(family v1.IPFamily, table string, listing []byte) (*Ruleset, error) {
	nf, err := nftFamily(family)
	if err != nil {
		return nil, err
	}
	fake := knftables.NewFake(nf, table)
	if err := loadListing(fake, nf, table, string(listing)); err != nil {
		return nil, fmt.Errorf("reading nft list table %s %s: %w", nf, table, err)
	}
	return &Ruleset{mode: ModeNFTables, family: family, nft: fake, table: table}, nil
}

func nftFamily(family v1.IPFamily) (knftables.Family, error) {
	switch family {
	case v1.IPv4Protocol:
		return knftables.IPv4Family, nil
	case v1.IPv6Protocol:
		return knftables.IPv6Family, nil
	}
	return "", fmt.Errorf("unknown IP family %q", family)
}

// dryRunHeader is the comment line before each sync of a dry run: the
// family, and the command the input is for.
var dryRunHeader = regexp.MustCompile(`(?m)^# (IPv4|IPv6): (.*) input(?: for table (ip|ip6) (\S+))?$`)

// ParseDryRun returns, by IP family, the Rulesets that the output of a dry
// run (kubeproxy.WithDryRun, proxier --dry-run) in iptables or nftables
// mode would leave on a node that had none: each family's last sync is
// applied to an empty state. In iptables mode it adds the jumps from the
// built-in chains that the proxy adds outside its restore input, for the
// chain prefix (with the kubelet's KUBE-FIREWALL jumps when
// localhostNodePorts, as an IPv4 writer adds them). It fails on output
// of another mode (IPVS), or when the input does not apply.
func ParseDryRun(out []byte, chainPrefix string, localhostNodePorts bool) (map[v1.IPFamily]*Ruleset, error) {
	locs := dryRunHeader.FindAllSubmatchIndex(out, -1)
	if len(locs) == 0 {
		return nil, fmt.Errorf("no iptables-restore or nft input in the dry run's output")
	}
	last := map[v1.IPFamily][]byte{}
	heads := map[v1.IPFamily][]int{}
	for i, loc := range locs {
		end := len(out)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		family := v1.IPFamily(out[loc[2]:loc[3]])
		last[family] = out[loc[1]:end]
		heads[family] = loc
	}
	sets := map[v1.IPFamily]*Ruleset{}
	for family, body := range last {
		loc := heads[family]
		command := string(out[loc[4]:loc[5]])
		var rs *Ruleset
		var err error
		switch {
		case strings.HasSuffix(command, "tables-restore"):
			rs, err = restoreRuleset(family, body, chainPrefix, localhostNodePorts && family == v1.IPv4Protocol)
		case command == "nft -f" && loc[8] >= 0:
			rs, err = transactionRuleset(family, string(out[loc[8]:loc[9]]), body)
		default:
			err = fmt.Errorf("%s input is not traced", command)
		}
		if err != nil {
			return nil, fmt.Errorf("dry run, %s: %w", family, err)
		}
		sets[family] = rs
	}
	return sets, nil
}

// restoreRuleset applies an iptables-restore input, and the jump rules, to
// empty tables.
func restoreRuleset(family v1.IPFamily, payload []byte, chainPrefix string, localhost bool) (*Ruleset, error) {
	if chainPrefix == "" {
		chainPrefix = iptables.DefaultChainPrefix
	}
	f, err := newIPTablesFake(family)
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	if err := f.RestoreAll(ctx, payload, iptables.NoFlushTables, iptables.NoRestoreCounters); err != nil {
		return nil, err
	}
	w, err := iptables.NewWriter(iptables.WriterConfig{Family: family, ChainPrefix: chainPrefix, LocalhostNodePorts: localhost})
	if err != nil {
		return nil, err
	}
	if err := iptables.EnsureJumps(ctx, f, w.JumpRules()); err != nil {
		return nil, err
	}
	return &Ruleset{mode: ModeIPTables, family: family, ipt: f, prefix: chainPrefix}, nil
}

// transactionRuleset applies an `nft -f` input made of add, flush and
// delete commands to an empty table.
func transactionRuleset(family v1.IPFamily, table string, body []byte) (*Ruleset, error) {
	nf, err := nftFamily(family)
	if err != nil {
		return nil, err
	}
	fake := knftables.NewFake(nf, table)
	ctx := context.Background()
	// Consecutive add commands go to the fake's parser at once; a flush
	// or delete is its own transaction, in order.
	var adds bytes.Buffer
	flushAdds := func() error {
		if adds.Len() == 0 {
			return nil
		}
		err := fake.ParseDump(adds.String())
		adds.Reset()
		return err
	}
	for line := range strings.SplitSeq(string(body), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		verb, rest, _ := strings.Cut(line, " ")
		if verb == "add" {
			adds.WriteString(line)
			adds.WriteByte('\n')
			continue
		}
		if err := flushAdds(); err != nil {
			return nil, err
		}
		words := strings.Fields(rest)
		if len(words) < 4 || (verb != "flush" && verb != "delete") {
			return nil, fmt.Errorf("cannot apply %q", line)
		}
		var obj knftables.Object
		switch words[0] {
		case "chain":
			obj = &knftables.Chain{Name: words[3]}
		case "set":
			obj = &knftables.Set{Name: words[3]}
		case "map":
			obj = &knftables.Map{Name: words[3]}
		default:
			return nil, fmt.Errorf("cannot apply %q", line)
		}
		tx := fake.NewTransaction()
		if verb == "flush" {
			tx.Flush(obj)
		} else {
			tx.Delete(obj)
		}
		if err := fake.Run(ctx, tx); err != nil {
			return nil, fmt.Errorf("%q: %w", line, err)
		}
	}
	if err := flushAdds(); err != nil {
		return nil, err
	}
	return &Ruleset{mode: ModeNFTables, family: family, nft: fake, table: table}, nil
}

func saveCommand(family v1.IPFamily) string {
	if family == v1.IPv6Protocol {
		return "ip6tables-save"
	}
	return "iptables-save"
}
