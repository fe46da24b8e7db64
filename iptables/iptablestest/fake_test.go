package iptablestest

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/iptables"
)

func TestFakeChains(t *testing.T) {
	ctx := context.Background()
	f := NewFake()
	if f.Dump() != "" || f.Chains(iptables.TableNAT) != nil {
		t.Fatalf("new Fake is not empty: %q", f.Dump())
	}
	// A table that was never changed still has its built-in chains.
	if ok, err := f.ChainExists(ctx, iptables.TableNAT, iptables.ChainPostrouting); !ok || err != nil {
		t.Errorf("ChainExists(nat, POSTROUTING) on a new Fake = %v, %v", ok, err)
	}
	for _, tc := range []struct {
		name string
		do   func() (any, error)
		want any
		// check tests the error (nil: no error expected).
		check func(error) bool
	}{
		{name: "EnsureChain creates", do: func() (any, error) { return f.EnsureChain(ctx, iptables.TableNAT, "KUBE-A") }, want: false},
		{name: "EnsureChain again", do: func() (any, error) { return f.EnsureChain(ctx, iptables.TableNAT, "KUBE-A") }, want: true},
		{name: "EnsureChain of a built-in chain", do: func() (any, error) { return f.EnsureChain(ctx, iptables.TableNAT, "OUTPUT") }, want: true},
		{name: "ChainExists", do: func() (any, error) { return f.ChainExists(ctx, iptables.TableNAT, "KUBE-A") }, want: true},
		{name: "ChainExists of a missing chain", do: func() (any, error) { return f.ChainExists(ctx, iptables.TableNAT, "KUBE-B") }, want: false},
		{name: "ChainExists in another table", do: func() (any, error) { return f.ChainExists(ctx, iptables.TableFilter, "KUBE-A") }, want: false},
		{name: "EnsureChain with a bad name", do: func() (any, error) { return f.EnsureChain(ctx, iptables.TableNAT, "ABCDEFGHIJKLMNOPQRSTUVWXYZ123") }, want: false,
			check: func(err error) bool { return exitStatus(err) == 2 }},
		{name: "EnsureChain in a bad table", do: func() (any, error) { return f.EnsureChain(ctx, "foo", "X") }, want: false,
			check: func(err error) bool { return exitStatus(err) == 3 }},
		{name: "EnsureRule appends", do: func() (any, error) {
			return f.EnsureRule(ctx, iptables.Append, iptables.TableNAT, "KUBE-A", "-m", "comment", "--comment", "first rule", "-j", "RETURN")
		}, want: false},
		{name: "EnsureRule prepends", do: func() (any, error) {
			return f.EnsureRule(ctx, iptables.Prepend, iptables.TableNAT, "KUBE-A", "-s", "10.0.0.1", "-j", "MARK", "--or-mark", "0x4000")
		}, want: false},
		{name: "EnsureRule finds the canonical form", do: func() (any, error) {
			return f.EnsureRule(ctx, iptables.Append, iptables.TableNAT, "KUBE-A", "-s", "10.0.0.1/32", "-j", "MARK", "--set-xmark", "0x4000/0x4000")
		}, want: true},
		{name: "RuleExists", do: func() (any, error) {
			return f.RuleExists(ctx, iptables.TableNAT, "KUBE-A", "-m", "comment", "--comment", "first rule", "-j", "RETURN")
		}, want: true},
		{name: "RuleExists of a missing rule", do: func() (any, error) { return f.RuleExists(ctx, iptables.TableNAT, "KUBE-A", "-j", "DROP") }, want: false},
		{name: "RuleExists in a missing chain", do: func() (any, error) { return f.RuleExists(ctx, iptables.TableNAT, "NOPE", "-j", "RETURN") }, want: false},
		{name: "RuleExists with bad arguments", do: func() (any, error) { return f.RuleExists(ctx, iptables.TableNAT, "KUBE-A", "--bogus") }, want: false,
			check: func(err error) bool { return exitStatus(err) == 2 }},
		{name: "EnsureRule in a missing chain", do: func() (any, error) {
			return f.EnsureRule(ctx, iptables.Append, iptables.TableNAT, "NOPE", "-j", "RETURN")
		}, want: false,
			check: iptables.IsNotFound},
		{name: "EnsureRule with a bad position", do: func() (any, error) {
			return f.EnsureRule(ctx, "-Z", iptables.TableNAT, "KUBE-A", "-j", "RETURN")
		}, want: false, check: func(err error) bool { return err != nil }},
		{name: "EnsureRule jumping to a missing chain", do: func() (any, error) {
			return f.EnsureRule(ctx, iptables.Append, iptables.TableNAT, "OUTPUT", "-j", "KUBE-B")
		}, want: false, check: func(err error) bool { return exitStatus(err) == 2 }},
		{name: "RuleExists jumping to a missing chain", do: func() (any, error) {
			return f.RuleExists(ctx, iptables.TableNAT, "OUTPUT", "-j", "KUBE-B")
		}, want: false},
		{name: "DeleteRule jumping to a missing chain", do: func() (any, error) { return nil, f.DeleteRule(ctx, iptables.TableNAT, "OUTPUT", "-j", "KUBE-B") }},
		{name: "EnsureRule jumping", do: func() (any, error) {
			return f.EnsureRule(ctx, iptables.Append, iptables.TableNAT, "OUTPUT", "-j", "KUBE-A")
		}, want: false},
		{name: "DeleteChain of a referenced chain", do: func() (any, error) { return nil, f.DeleteChain(ctx, iptables.TableNAT, "KUBE-A") },
			check: func(err error) bool { return err != nil && strings.Contains(err.Error(), "Too many links") }},
		{name: "DeleteRule", do: func() (any, error) { return nil, f.DeleteRule(ctx, iptables.TableNAT, "OUTPUT", "-j", "KUBE-A") }},
		{name: "DeleteRule again", do: func() (any, error) { return nil, f.DeleteRule(ctx, iptables.TableNAT, "OUTPUT", "-j", "KUBE-A") }},
		{name: "DeleteRule in a missing chain", do: func() (any, error) { return nil, f.DeleteRule(ctx, iptables.TableNAT, "NOPE", "-j", "KUBE-A") }},
		{name: "DeleteChain of a non-empty chain", do: func() (any, error) { return nil, f.DeleteChain(ctx, iptables.TableNAT, "KUBE-A") },
			check: func(err error) bool { return err != nil && strings.Contains(err.Error(), "Directory not empty") }},
		{name: "FlushChain", do: func() (any, error) { return nil, f.FlushChain(ctx, iptables.TableNAT, "KUBE-A") }},
		{name: "FlushChain of a missing chain", do: func() (any, error) { return nil, f.FlushChain(ctx, iptables.TableNAT, "NOPE") }, check: iptables.IsNotFound},
		{name: "DeleteChain", do: func() (any, error) { return nil, f.DeleteChain(ctx, iptables.TableNAT, "KUBE-A") }},
		{name: "DeleteChain of a missing chain", do: func() (any, error) { return nil, f.DeleteChain(ctx, iptables.TableNAT, "KUBE-A") }, check: iptables.IsNotFound},
		{name: "DeleteChain of a built-in chain", do: func() (any, error) { return nil, f.DeleteChain(ctx, iptables.TableNAT, "OUTPUT") },
			check: func(err error) bool { return err != nil }},
	} {
		got, err := tc.do()
		if tc.check == nil && err != nil {
			t.Errorf("%s: unexpected error %v", tc.name, err)
		} else if tc.check != nil && !tc.check(err) {
			t.Errorf("%s: error %v is not the one expected", tc.name, err)
		}
		if tc.want != nil && got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
	want := "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n"
	if diff := cmp.Diff(want, f.Dump()); diff != "" {
		t.Errorf("final state (-want +got):\n%s", diff)
	}
}

func TestFakeSaveInto(t *testing.T) {
	ctx := context.Background()
	f := NewIPv6Fake()
	var buf bytes.Buffer
	buf.WriteString("# before\n")
	if err := f.SaveInto(ctx, iptables.TableRaw, &buf); err != nil {
		t.Fatal(err)
	}
	want := "# before\n*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n"
	if diff := cmp.Diff(want, buf.String()); diff != "" {
		t.Errorf("SaveInto (-want +got):\n%s", diff)
	}
	if f.Dump() != "" {
		t.Errorf("SaveInto of an unchanged table changed the Fake: %q", f.Dump())
	}
	if err := f.SaveInto(ctx, "foo", &buf); err == nil {
		t.Error("SaveInto(foo) succeeded")
	}
	if _, err := f.EnsureChain(ctx, iptables.TableRaw, "C"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.EnsureRule(ctx, iptables.Append, iptables.TableRaw, "C", "-s", "fd00::/8", "-j", "ACCEPT"); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	if err := f.SaveInto(ctx, iptables.TableRaw, &buf); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(f.Dump(), buf.String()); diff != "" {
		t.Errorf("SaveInto and Dump differ (-dump +save):\n%s", diff)
	}
	if diff := cmp.Diff([]iptables.Chain{"PREROUTING", "OUTPUT", "C"}, iptables.ChainsFromSave(buf.Bytes())); diff != "" {
		t.Errorf("chains (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"-s fd00::/8 -j ACCEPT"}, f.Rules(iptables.TableRaw, "C")); diff != "" {
		t.Errorf("Rules (-want +got):\n%s", diff)
	}
	if f.Rules(iptables.TableRaw, "NOPE") != nil {
		t.Error("Rules of a missing chain is not nil")
	}
}

func TestFakeProperties(t *testing.T) {
	for _, tc := range []struct {
		fake        *Fake
		family      v1.IPFamily
		backend     iptables.Backend
		version     iptables.Version
		randomFully bool
	}{
		{fake: NewFake(), family: v1.IPv4Protocol, backend: iptables.BackendNFT, version: iptables.Version{Major: 1, Minor: 8, Patch: 9}, randomFully: true},
		{fake: NewIPv6Fake(WithBackend(iptables.BackendLegacy), WithVersion(iptables.Version{Major: 1, Minor: 6, Patch: 1})),
			family: v1.IPv6Protocol, backend: iptables.BackendLegacy, version: iptables.Version{Major: 1, Minor: 6, Patch: 1}},
	} {
		f := tc.fake
		if f.Family() != tc.family || f.Backend() != tc.backend || f.Version() != tc.version || f.HasRandomFully() != tc.randomFully {
			t.Errorf("got %v %v %v %v, want %v %v %v %v", f.Family(), f.Backend(), f.Version(), f.HasRandomFully(),
				tc.family, tc.backend, tc.version, tc.randomFully)
		}
		if err := f.Present(context.Background()); err != nil {
			t.Errorf("Present: %v", err)
		}
		_, err := f.EnsureRule(context.Background(), iptables.Append, iptables.TableNAT, iptables.ChainPostrouting, "-j", "MASQUERADE", "--random-fully")
		if (err == nil) != tc.randomFully {
			t.Errorf("MASQUERADE --random-fully with version %v: %v", tc.version, err)
		}
	}
}

func TestFakeIPSets(t *testing.T) {
	f := NewFake(WithIPSets(func(name string) bool { return name == "KUBE-CLUSTER-IP" }))
	ctx := context.Background()
	if _, err := f.EnsureRule(ctx, iptables.Append, iptables.TableNAT, iptables.ChainPrerouting, "-m", "set", "--match-set", "KUBE-CLUSTER-IP", "dst,dst", "-j", "ACCEPT"); err != nil {
		t.Errorf("rule with an existing set: %v", err)
	}
	if _, err := f.EnsureRule(ctx, iptables.Append, iptables.TableNAT, iptables.ChainPrerouting, "-m", "set", "--match-set", "OTHER", "dst", "-j", "ACCEPT"); err == nil {
		t.Error("rule with a missing set accepted")
	}
}

func exitStatus(err error) int {
	var e *iptables.Error
	if errors.As(err, &e) {
		return e.ExitStatus
	}
	return -100
}
