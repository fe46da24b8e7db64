package iptables_test

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/iptables"
)

// TestCleanupKernel runs Cleanup against the real iptables of each backend
// in a throwaway namespace that also holds other programs' rules: after
// the writer's rules, the jump rules and the canary were applied and
// cleaned up, iptables-save must show exactly what it showed before; and a
// chain of the proxy that another program uses must survive.
func TestCleanupKernel(t *testing.T) {
	for _, backend := range []iptables.Backend{iptables.BackendLegacy, iptables.BackendNFT} {
		t.Run(string(backend), func(t *testing.T) {
			kerneltest.Require(t, kernelTools(backend)...)
			testCleanupKernel(t, backend)
		})
	}
}

func testCleanupKernel(t *testing.T, backend iptables.Backend) {
	ctx := context.Background()
	ns := kerneltest.NewNS(t)
	ipt, err := iptables.New(ctx, v1.IPv4Protocol, iptables.WithBackend(backend),
		iptables.WithLockFile(filepath.Join(t.TempDir(), "xtables.lock")))
	if err != nil {
		t.Fatal(err)
	}
	do := func(f func() error) {
		t.Helper()
		if err := ns.Do(f); err != nil {
			t.Fatal(err)
		}
	}
	saveAll := func() string {
		t.Helper()
		var all bytes.Buffer
		do(func() error {
			for _, table := range []iptables.Table{iptables.TableFilter, iptables.TableNAT, iptables.TableMangle} {
				if err := ipt.SaveInto(ctx, table, &all); err != nil {
					return err
				}
			}
			return nil
		})
		return string(stripCounters(all.Bytes()))
	}
	install := func() {
		t.Helper()
		w := mustWriter(t, scnWriterConfig(ipt.HasRandomFully()))
		res := w.Sync(ctx, scnCluster().input())
		do(func() error {
			if err := w.EnsureJumpRules(ctx, ipt); err != nil {
				return err
			}
			if err := ipt.RestoreAll(ctx, res.Payload, iptables.NoFlushTables, iptables.RestoreCounters); err != nil {
				return err
			}
			for _, table := range []iptables.Table{iptables.TableMangle, iptables.TableNAT, iptables.TableFilter} {
				if _, err := ipt.EnsureChain(ctx, table, iptables.ProxyCanaryChain); err != nil {
					return err
				}
				if _, err := ipt.EnsureRule(ctx, iptables.Append, table, iptables.ProxyCanaryChain, "-j", "RETURN"); err != nil {
					return err
				}
			}
			return nil
		})
		w.Applied(nil)
	}

	do(func() error {
		return ipt.RestoreAll(ctx, []byte(cleanupForeign), iptables.NoFlushTables, iptables.NoRestoreCounters)
	})
	before := saveAll()
	install()
	if saveAll() == before {
		t.Fatal("the proxy's rules did not change the tables")
	}
	var n int
	do(func() (err error) {
		n, err = kubeChains.Cleanup(ctx, ipt)
		return err
	})
	if diff := cmp.Diff(before, saveAll()); diff != "" {
		t.Errorf("after Cleanup, iptables-save differs from before the proxy ran (-before +after):\n%s", diff)
	}
	if n < 10 {
		t.Errorf("Cleanup reports %d chains deleted", n)
	}

	// Another program's rule keeps KUBE-MARK-MASQ, and only it, alive.
	install()
	do(func() error {
		return ipt.RestoreAll(ctx, []byte("*nat\n:CNI-HOSTPORT-SETMARK - [0:0]\n-A CNI-HOSTPORT-SETMARK -j KUBE-MARK-MASQ\nCOMMIT\n"),
			iptables.NoFlushTables, iptables.NoRestoreCounters)
	})
	var cleanupErr error
	do(func() error {
		_, cleanupErr = kubeChains.Cleanup(ctx, ipt)
		return nil
	})
	if cleanupErr == nil || !strings.Contains(cleanupErr.Error(), "KUBE-MARK-MASQ (used by CNI-HOSTPORT-SETMARK)") {
		t.Errorf("Cleanup with a used chain: got error %v, want one naming KUBE-MARK-MASQ and its user", cleanupErr)
	}
	var left []string
	for line := range strings.Lines(saveAll()) {
		if strings.HasPrefix(line, ":KUBE-") && !strings.Contains(before, line) {
			left = append(left, strings.TrimSpace(line))
		}
	}
	if diff := cmp.Diff([]string{":KUBE-MARK-MASQ -"}, left); diff != "" {
		t.Errorf("the proxy's chains left (-want +got):\n%s", diff)
	}
}
