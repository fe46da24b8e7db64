package ipsettest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/ipset"
)

func TestRestoreDumpRoundTrip(t *testing.T) {
	const text = `create A hash:ip family inet hashsize 1024 maxelem 65536
add A 10.0.0.1
add A 10.0.0.2
create N hash:net family inet6 hashsize 4096 maxelem 10
add N fd00::/64
create P bitmap:port range 1-100
add P 80
create S hash:ip,port,net family inet hashsize 1024 maxelem 65536
add S 10.0.0.1,tcp:80,10.1.0.0/16
`
	f := NewFake()
	if err := f.Restore("# comment\n\n" + text); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(text, f.Dump()); diff != "" {
		t.Errorf("Dump after Restore (-want +got):\n%s", diff)
	}
	if got := f.Counts(); got != (Counts{}) {
		t.Errorf("Restore changed the counts: %+v", got)
	}
}

func TestRestoreRejects(t *testing.T) {
	for _, text := range []string{
		"create A hash:mac",
		"create A hash:ip family",
		"create A hash:ip hashsize big",
		"create A hash:ip colour red",
		"create P bitmap:port range 1",
		"add A 10.0.0.1",
		"create A hash:ip\nadd A 10.0.0.1,tcp:80",
		"create A hash:ip\ncreate A hash:ip",
		"delete A",
	} {
		if err := NewFake().Restore(text); err == nil || !strings.Contains(err.Error(), "line ") {
			t.Errorf("Restore(%q) = %v, want an error naming the line", text, err)
		}
	}
}

func TestCountsAndReferences(t *testing.T) {
	ctx := context.Background()
	f := NewFake()
	set := ipset.Set{Name: "A", Type: ipset.HashIP}
	e, _ := ipset.ParseEntry(ipset.HashIP, "10.0.0.1")
	_ = f.Create(ctx, set)
	_ = f.Add(ctx, "A", e)
	_ = f.Add(ctx, "A", e)             // fails, still counted
	_ = f.Add(ctx, "A", ipset.Entry{}) // invalid: refused before counting
	_, _ = f.Test(ctx, "A", e)
	_, _ = f.ListEntries(ctx, "A")
	_, _ = f.ListSets(ctx)
	_, _ = f.Version(ctx)
	if err := f.Reference("A"); err != nil {
		t.Fatal(err)
	}
	if err := f.Reference("B"); !errors.Is(err, ipset.ErrNotFound) {
		t.Errorf("Reference of a missing set = %v, want ErrNotFound", err)
	}
	if err := f.Destroy(ctx, "A"); !errors.Is(err, ipset.ErrInUse) {
		t.Errorf("Destroy of a referenced set = %v, want ErrInUse", err)
	}
	f.Unreference("A")
	f.Unreference("A") // no-op
	if err := f.Destroy(ctx, "A"); err != nil {
		t.Errorf("Destroy after Unreference = %v", err)
	}
	want := Counts{Create: 1, Add: 2, Destroy: 2, Test: 1, ListEntries: 1, ListSets: 1, Version: 1}
	if diff := cmp.Diff(want, f.Counts()); diff != "" {
		t.Errorf("Counts (-want +got):\n%s", diff)
	}
	if got := f.Counts().Writes(); got != 5 {
		t.Errorf("Writes() = %d, want 5", got)
	}
	f.ResetCounts()
	if f.Counts() != (Counts{}) {
		t.Errorf("ResetCounts left %+v", f.Counts())
	}
}

func TestSwapKeepsReferencesWithNames(t *testing.T) {
	ctx := context.Background()
	f := NewFake()
	if err := f.Restore("create A hash:ip\nadd A 10.0.0.1\ncreate B hash:ip hashsize 4096\n"); err != nil {
		t.Fatal(err)
	}
	_ = f.Reference("A")
	if err := f.Swap(ctx, "A", "B"); err != nil {
		t.Fatal(err)
	}
	want := "create A hash:ip family inet hashsize 4096 maxelem 65536\ncreate B hash:ip family inet hashsize 1024 maxelem 65536\nadd B 10.0.0.1\n"
	if diff := cmp.Diff(want, f.Dump()); diff != "" {
		t.Errorf("after swap (-want +got):\n%s", diff)
	}
	if err := f.Destroy(ctx, "B"); err != nil {
		t.Errorf("Destroy(B), unreferenced after the swap: %v", err)
	}
	if err := f.Destroy(ctx, "A"); !errors.Is(err, ipset.ErrInUse) {
		t.Errorf("Destroy(A), whose name holds the reference: %v", err)
	}
}
