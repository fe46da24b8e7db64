package iptables

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	utilexec "k8s.io/utils/exec"
)

// Backend is the kernel interface iptables programs: the legacy x_tables
// ("iptables-legacy") or nf_tables ("iptables-nft"). Rules written through
// one backend are invisible to the other, so every program on a node must
// use the same one.
type Backend string

const (
	// BackendLegacy is x_tables, through iptables-legacy,
	// iptables-legacy-save and iptables-legacy-restore (or, on systems
	// that predate the split, plain iptables that reports no mode or
	// "(legacy)").
	BackendLegacy Backend = "legacy"
	// BackendNFT is nf_tables, through iptables-nft, iptables-nft-save and
	// iptables-nft-restore (or plain iptables that reports "(nf_tables)").
	BackendNFT Backend = "nft"
)

// String returns "legacy" or "nft".
func (b Backend) String() string { return string(b) }

// hintChains are chains that kubelet (KUBE-IPTABLES-HINT) and older
// kubelets (KUBE-KUBELET-CANARY) create in the mangle table of the backend
// the node uses, so that containers can pick the same one.
var hintChains = [][]byte{[]byte(":KUBE-IPTABLES-HINT "), []byte(":KUBE-KUBELET-CANARY ")}

// detectTimeout bounds each iptables-save run by DetectBackend; an
// nft-save stuck on a huge ruleset must not hang start-up.
const detectTimeout = 5 * time.Second

// DetectBackend decides which backend this node uses, the way the
// iptables-wrapper of the Kubernetes project does:
//
//  1. if both backends' binaries are installed, the backend whose mangle
//     table holds the kubelet's hint chain (KUBE-IPTABLES-HINT or
//     KUBE-KUBELET-CANARY), nft first; failing that, the backend that holds
//     more rules (counting "-A" lines of iptables-save and ip6tables-save
//     of each), nft on a tie;
//  2. if only one backend's binaries are installed, that one;
//  3. if only a plain "iptables" is installed, the backend its --version
//     names (no name means legacy).
//
// It returns an error only when no iptables binary is found. exec may be
// nil for the real one. The saves run in the caller's network namespace.
func DetectBackend(ctx context.Context, exec utilexec.Interface) (Backend, error) {
	if exec == nil {
		exec = utilexec.New()
	}
	logger := klog.FromContext(ctx)
	legacy := haveBackendBinaries(exec, BackendLegacy)
	nft := haveBackendBinaries(exec, BackendNFT)
	switch {
	case legacy && nft:
		legacySaves := [][]byte{
			detectSave(ctx, exec, "iptables-legacy-save"),
			detectSave(ctx, exec, "ip6tables-legacy-save"),
		}
		nftSaves := [][]byte{
			detectSave(ctx, exec, "iptables-nft-save"),
			detectSave(ctx, exec, "ip6tables-nft-save"),
		}
		if hasHintChain(nftSaves) {
			logger.V(2).Info("Detected iptables backend from kubelet's hint chain", "backend", BackendNFT)
			return BackendNFT, nil
		}
		if hasHintChain(legacySaves) {
			logger.V(2).Info("Detected iptables backend from kubelet's hint chain", "backend", BackendLegacy)
			return BackendLegacy, nil
		}
		nl, nn := countRules(legacySaves), countRules(nftSaves)
		backend := BackendNFT
		if nl > nn {
			backend = BackendLegacy
		}
		logger.V(2).Info("Detected iptables backend from rule counts", "backend", backend, "legacyRules", nl, "nftRules", nn)
		return backend, nil
	case legacy:
		return BackendLegacy, nil
	case nft:
		return BackendNFT, nil
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		return "", fmt.Errorf("detecting iptables backend: no iptables, iptables-legacy or iptables-nft binary found")
	}
	_, mode, err := runVersion(ctx, exec, "iptables")
	if err != nil {
		return "", fmt.Errorf("detecting iptables backend: %w", err)
	}
	if mode == "nf_tables" {
		return BackendNFT, nil
	}
	return BackendLegacy, nil
}

func haveBackendBinaries(exec utilexec.Interface, b Backend) bool {
	for _, name := range []string{"iptables-" + string(b), "iptables-" + string(b) + "-save", "iptables-" + string(b) + "-restore"} {
		if _, err := exec.LookPath(name); err != nil {
			return false
		}
	}
	return true
}

// detectSave returns the output of an iptables-save binary, or nil if it
// is missing or fails (a kernel without IPv6, say): detection must work
// with what there is.
func detectSave(ctx context.Context, exec utilexec.Interface, name string) []byte {
	if _, err := exec.LookPath(name); err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, detectTimeout)
	defer cancel()
	var stdout bytes.Buffer
	cmd := exec.CommandContext(ctx, name)
	cmd.SetStdout(&stdout)
	cmd.SetStderr(nil)
	if err := cmd.Run(); err != nil {
		klog.FromContext(ctx).V(4).Info("iptables-save failed during backend detection", "command", name, "err", err)
		return nil
	}
	return stdout.Bytes()
}

func hasHintChain(saves [][]byte) bool {
	for _, s := range saves {
		for _, h := range hintChains {
			if bytes.Contains(s, h) {
				return true
			}
		}
	}
	return false
}

// countRules counts the lines starting with "-" (rules) in saves.
func countRules(saves [][]byte) int {
	n := 0
	for _, s := range saves {
		sc := bufio.NewScanner(bytes.NewReader(s))
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			if line := sc.Bytes(); len(line) > 0 && line[0] == '-' {
				n++
			}
		}
	}
	return n
}

// commands are the binaries an Interface runs.
type commands struct {
	iptables, save, restore string
}

// resolveCommands finds the binaries of backend b for family f: the
// suffixed ones (iptables-nft, ...) if installed, else the plain ones if
// their --version reports that backend. It returns them with the version
// they report.
func resolveCommands(ctx context.Context, exec utilexec.Interface, b Backend, f v1.IPFamily) (commands, Version, error) {
	base := "iptables"
	if f == v1.IPv6Protocol {
		base = "ip6tables"
	}
	if b != BackendLegacy && b != BackendNFT {
		return commands{}, Version{}, fmt.Errorf("unknown iptables backend %q", b)
	}
	suffixed := commands{
		iptables: base + "-" + string(b),
		save:     base + "-" + string(b) + "-save",
		restore:  base + "-" + string(b) + "-restore",
	}
	if _, err := exec.LookPath(suffixed.iptables); err == nil {
		v, _, err := runVersion(ctx, exec, suffixed.iptables)
		if err != nil {
			return commands{}, Version{}, err
		}
		return suffixed, v, nil
	}
	plain := commands{iptables: base, save: base + "-save", restore: base + "-restore"}
	if _, err := exec.LookPath(plain.iptables); err != nil {
		return commands{}, Version{}, fmt.Errorf("%s backend for %s: neither %s nor %s found", b, f, suffixed.iptables, plain.iptables)
	}
	v, mode, err := runVersion(ctx, exec, plain.iptables)
	if err != nil {
		return commands{}, Version{}, err
	}
	plainBackend := BackendLegacy
	if mode == "nf_tables" {
		plainBackend = BackendNFT
	}
	if plainBackend != b {
		return commands{}, Version{}, fmt.Errorf("%s backend for %s: %s not found and %s uses the %s backend", b, f, suffixed.iptables, plain.iptables, plainBackend)
	}
	return plain, v, nil
}

// runVersion runs "name --version" and parses its output.
func runVersion(ctx context.Context, exec utilexec.Interface, name string) (Version, string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, "--version")
	cmd.SetStdout(&stdout)
	cmd.SetStderr(&stderr)
	if err := cmd.Run(); err != nil {
		return Version{}, "", newError(name, []string{"--version"}, err, stderr.String())
	}
	v, mode, err := parseVersionOutput(stdout.String())
	if err != nil {
		return Version{}, "", fmt.Errorf("%s --version: %w", name, err)
	}
	return v, mode, nil
}
