package iptables_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
)

// TestCleanupQuotedComments checks the cleanup payload, which deletes
// jumps to the proxy's chains by repeating them as iptables-save printed
// them: jumps whose comments hold quotes, backslashes, apostrophes, tabs
// and a fake "-j" are deleted exactly, and other programs' rules whose
// comments only mention the proxy's chains stay.
func TestCleanupQuotedComments(t *testing.T) {
	ctx := context.Background()
	f := iptablestest.NewFake()
	installProxy(t, f, scnWriterConfig(true), scnCluster())
	hostile := []string{
		`x\" -j ACCEPT\nCOMMIT\n*filter\n-F INPUT\n#`,
		`back\\slash\\`,
		`it's \"quoted\"`,
		"tab\tand\rcr",
	}
	var foreign []string
	for _, c := range hostile {
		foreign = append(foreign, `-A INPUT -m comment --comment "`+c+`" -j KUBE-SERVICES`)
	}
	keep := []string{
		`-A INPUT -m comment --comment "\" -j KUBE-SERVICES" -j ACCEPT`,
		`-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT`,
	}
	input := "*filter\n" + strings.Join(append(foreign, keep...), "\n") + "\nCOMMIT\n"
	if err := f.RestoreAll(ctx, []byte(input), iptables.NoFlushTables, iptables.NoRestoreCounters); err != nil {
		t.Fatal(err)
	}
	want := f.Rules(iptables.TableFilter, iptables.ChainInput)
	want = want[len(want)-len(keep):]

	if _, err := kubeChains.Cleanup(ctx, f); err != nil {
		t.Fatalf("Cleanup: %v\n%s", err, f.Dump())
	}
	if diff := cmp.Diff(want, f.Rules(iptables.TableFilter, iptables.ChainInput)); diff != "" {
		t.Errorf("INPUT after Cleanup (-want +got):\n%s", diff)
	}
	for _, table := range []iptables.Table{iptables.TableFilter, iptables.TableNAT} {
		if i := slices.IndexFunc(f.Chains(table), func(c iptables.Chain) bool { return kubeChains.IsWriterChain(table, c) }); i >= 0 {
			t.Errorf("table %s still has the proxy's chain %s", table, f.Chains(table)[i])
		}
	}
}
