package explain

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/iptables"
)

// Target says which rules of a node to read.
type Target struct {
	// Mode is ModeIPTables or ModeNFTables.
	Mode string
	// ChainPrefix is the prefix of the proxy's iptables chains ("" means
	// iptables.DefaultChainPrefix, kube-proxy's KUBE).
	ChainPrefix string
	// Table is the nftables table ("" means kube-proxy's, "kube-proxy").
	Table string
	// Backend is the iptables backend whose tools read the rules:
	// iptables.BackendLegacy or iptables.BackendNFT; "" means the one
	// whose rules hold the prefix's SERVICES chain (nft first, as
	// kube-proxy looks), else iptables-save's.
	Backend iptables.Backend
	// NetNS is the path of the network namespace to read, such as
	// /run/netns/NAME or /proc/PID/ns/net; "" means the caller's.
	NetNS string
}

// DefaultTable is kube-proxy's nftables table, which proxykit's nftables
// mode also uses by default.
const DefaultTable = "kube-proxy"

// ReadKernel reads the rules of family that t names from the kernel, with
// the tools a node has: in iptables mode `iptables-save -t nat` and
// `iptables-save -t filter` (ip6tables-save for IPv6; with t.Backend
// empty, of the backend that holds the proxy's chains), in nftables mode
// `nft list table ip|ip6 TABLE`, run in t.NetNS. It changes nothing. It
// fails with an error naming what could not be read: a tool not in PATH,
// a table that does not exist, the tool's own message (such as a
// permission denied without CAP_NET_ADMIN), the proxy's SERVICES chain
// missing from the nat table (no proxy's rules to explain), or a rule the
// tracers cannot read. An iptables table the kernel does not have yet reads as empty, as
// iptables-save prints it.
func ReadKernel(ctx context.Context, t Target, family v1.IPFamily) (*Ruleset, error) {
	switch t.Mode {
	case ModeIPTables:
		prefix := t.ChainPrefix
		if prefix == "" {
			prefix = iptables.DefaultChainPrefix
		}
		backends := []iptables.Backend{t.Backend}
		if t.Backend == "" {
			backends = []iptables.Backend{iptables.BackendNFT, iptables.BackendLegacy, ""}
		}
		var save []byte
		var err error
		var read []string
		for _, b := range backends {
			command := saveCommand(family)
			if b != "" {
				command = strings.Replace(command, "-save", "-"+string(b)+"-save", 1)
			}
			if t.Backend == "" && b != "" {
				if _, lookErr := exec.LookPath(command); lookErr != nil {
					continue
				}
			}
			if save, err = saveTables(ctx, t.NetNS, command); err != nil {
				return nil, err
			}
			read = append(read, command)
			// Without a backend given, the one that holds the proxy's
			// chains, as kube-proxy picks it.
			if t.Backend != "" || bytes.Contains(save, []byte(":"+prefix+"-SERVICES ")) {
				break
			}
		}
		if !bytes.Contains(save, []byte(":"+prefix+"-SERVICES ")) {
			// Nothing to explain: every packet would go through
			// untouched, which would read as an answer.
			return nil, fmt.Errorf("no chain %s-SERVICES in the nat table of %s: this node has no rules of a proxy with chain prefix %s", prefix, strings.Join(read, " or "), prefix)
		}
		return IPTablesRuleset(family, save, t.ChainPrefix)
	case ModeNFTables:
		nf, err := nftFamily(family)
		if err != nil {
			return nil, err
		}
		table := t.Table
		if table == "" {
			table = DefaultTable
		}
		out, err := runIn(ctx, t.NetNS, "nft", "list", "table", string(nf), table)
		if err != nil {
			return nil, fmt.Errorf("reading nftables table %s %s: %w", nf, table, err)
		}
		return NFTablesRuleset(family, table, out)
	}
	return nil, fmt.Errorf("mode %q cannot be read: want %q or %q", t.Mode, ModeIPTables, ModeNFTables)
}

// saveTables runs command (an iptables-save) for the nat and filter
// tables.
func saveTables(ctx context.Context, netns, command string) ([]byte, error) {
	var all bytes.Buffer
	for _, table := range []iptables.Table{iptables.TableNAT, iptables.TableFilter} {
		out, err := runIn(ctx, netns, command, "-t", string(table))
		if err != nil {
			return nil, fmt.Errorf("reading the %s table: %w", table, err)
		}
		all.Write(out)
	}
	return all.Bytes(), nil
}

// ErrToolMissing is wrapped by ReadKernel's error when a tool it runs is
// not in PATH.
var ErrToolMissing = errors.New("not found in PATH")

// runIn runs name with args in the network namespace at netns ("" for
// the caller's) and returns its standard output; the error carries the
// command and its standard error.
func runIn(ctx context.Context, netns, name string, args ...string) ([]byte, error) {
	if _, err := exec.LookPath(name); err != nil {
		return nil, fmt.Errorf("%s: %w", name, ErrToolMissing)
	}
	var out []byte
	err := inNetNS(netns, func() error {
		cmd := exec.CommandContext(ctx, name, args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		var err error
		out, err = cmd.Output()
		if err != nil {
			return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
		}
		return nil
	})
	return out, err
}
