package ipset_test

// The behaviour table and the reconcile scenarios in this file run against
// the fake (TestFake*, everywhere) and against the kernel (TestKernel*, in a
// throwaway network namespace), so that the fake is held to what the kernel
// really does.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/ipset/ipsettest"
)

// errAny stands for "some error, of no particular kind".
var errAny = errors.New("any error")

// referenceFunc makes something in the "kernel" reference the named set, as
// an iptables rule with "-m set --match-set" does.
type referenceFunc func(t *testing.T, name string)

type behaviourStep struct {
	desc string
	do   func(ctx context.Context, iface ipset.Interface, ref func(string)) error
	want error
}

func create(s ipset.Set) func(context.Context, ipset.Interface, func(string)) error {
	return func(ctx context.Context, i ipset.Interface, _ func(string)) error { return i.Create(ctx, s) }
}

func add(name string, e ipset.Entry) func(context.Context, ipset.Interface, func(string)) error {
	return func(ctx context.Context, i ipset.Interface, _ func(string)) error { return i.Add(ctx, name, e) }
}

func del(name string, e ipset.Entry) func(context.Context, ipset.Interface, func(string)) error {
	return func(ctx context.Context, i ipset.Interface, _ func(string)) error { return i.Del(ctx, name, e) }
}

func test(name string, e ipset.Entry, member bool) func(context.Context, ipset.Interface, func(string)) error {
	return func(ctx context.Context, i ipset.Interface, _ func(string)) error {
		got, err := i.Test(ctx, name, e)
		if err == nil && got != member {
			return fmt.Errorf("Test(%s, %s) = %v, want %v", name, e, got, member)
		}
		return err
	}
}

var behaviour = []behaviourStep{
	{"create hash:ip", create(ipset.Set{Name: "A", Type: ipset.HashIP}), nil},
	{"create it again", create(ipset.Set{Name: "A", Type: ipset.HashIP}), ipset.ErrAlreadyExists},
	{"create the name with another type", create(ipset.Set{Name: "A", Type: ipset.HashNet}), ipset.ErrAlreadyExists},
	{"create an invalid set", create(ipset.Set{Name: "bad name", Type: ipset.HashIP}), ipset.ErrInvalid},
	{"add", add("A", ipset.IPEntry(a4)), nil},
	{"add a second", add("A", ipset.IPEntry(b4)), nil},
	{"add a member again", add("A", ipset.IPEntry(a4)), ipset.ErrAlreadyExists},
	{"add IPv6 to an IPv4 set", add("A", ipset.IPEntry(a6)), ipset.ErrInvalid},
	{"add a hash:ip,port entry to hash:ip", add("A", ipset.IPPortEntry(a4, tcp, 80)), ipset.ErrInvalid},
	{"add a malformed entry", add("A", ipset.Entry{Type: ipset.HashIP}), ipset.ErrInvalid},
	{"add to a missing set", add("nope", ipset.IPEntry(a4)), ipset.ErrNotFound},
	{"test a member", test("A", ipset.IPEntry(a4), true), nil},
	{"test a non-member", test("A", ipset.IPEntry(netipAddr("10.9.9.9")), false), nil},
	{"test in a missing set", test("nope", ipset.IPEntry(a4), false), ipset.ErrNotFound},
	{"delete a member", del("A", ipset.IPEntry(b4)), nil},
	{"delete a non-member", del("A", ipset.IPEntry(b4)), ipset.ErrNotFound},
	{"delete from a missing set", del("nope", ipset.IPEntry(a4)), ipset.ErrNotFound},
	{"flush a missing set", func(ctx context.Context, i ipset.Interface, _ func(string)) error { return i.Flush(ctx, "nope") }, ipset.ErrNotFound},

	{"create hash:net", create(ipset.Set{Name: "N", Type: ipset.HashNet}), nil},
	{"add a network", add("N", ipset.NetEntry(n4)), nil},
	{"add a host network", add("N", ipset.NetEntry(netipPrefix("10.9.0.1/32"))), nil},
	{"add a zero-length network", add("N", ipset.Entry{Type: ipset.HashNet, Net: netipPrefix("0.0.0.0/0")}), ipset.ErrInvalid},
	{"create hash:ip inet6", create(ipset.Set{Name: "A6", Type: ipset.HashIP, Family: ipset.FamilyIPv6}), nil},
	{"add IPv4 to an IPv6 set", add("A6", ipset.IPEntry(a4)), ipset.ErrInvalid},
	{"add IPv6", add("A6", ipset.IPEntry(a6)), nil},
	{"create hash:ip with a larger hash", create(ipset.Set{Name: "A2", Type: ipset.HashIP, HashSize: 4096}), nil},
	{"add to it", add("A2", ipset.IPEntry(b4)), nil},

	{"swap with a missing set", func(ctx context.Context, i ipset.Interface, _ func(string)) error { return i.Swap(ctx, "A", "nope") }, ipset.ErrNotFound},
	{"swap a missing set", func(ctx context.Context, i ipset.Interface, _ func(string)) error { return i.Swap(ctx, "nope", "A") }, ipset.ErrNotFound},
	{"swap hash:ip and hash:net", func(ctx context.Context, i ipset.Interface, _ func(string)) error { return i.Swap(ctx, "A", "N") }, ipset.ErrTypeMismatch},
	{"swap inet and inet6", func(ctx context.Context, i ipset.Interface, _ func(string)) error { return i.Swap(ctx, "A", "A6") }, ipset.ErrTypeMismatch},
	{"swap sets of the same kind, A referenced", func(ctx context.Context, i ipset.Interface, ref func(string)) error {
		ref("A")
		return i.Swap(ctx, "A", "A2")
	}, nil},
	{"A now holds A2's member", test("A", ipset.IPEntry(b4), true), nil},
	{"and A2 A's", test("A2", ipset.IPEntry(a4), true), nil},
	{"destroy the referenced name", func(ctx context.Context, i ipset.Interface, _ func(string)) error { return i.Destroy(ctx, "A") }, ipset.ErrInUse},
	{"destroy the other one", func(ctx context.Context, i ipset.Interface, _ func(string)) error { return i.Destroy(ctx, "A2") }, nil},
	{"destroy a missing set", func(ctx context.Context, i ipset.Interface, _ func(string)) error { return i.Destroy(ctx, "A2") }, nil},

	{"create bitmap:port", create(ipset.Set{Name: "P", Type: ipset.BitmapPort, PortFrom: 30000, PortTo: 30010}), nil},
	{"add a port", add("P", ipset.PortEntry(30001)), nil},
	{"add a port again", add("P", ipset.PortEntry(30001)), ipset.ErrAlreadyExists},
	{"add a port out of range", add("P", ipset.PortEntry(29999)), ipset.ErrInvalid},
	{"test a port", test("P", ipset.PortEntry(30001), true), nil},
	{"test another port", test("P", ipset.PortEntry(30002), false), nil},
	{"add and delete a port", func(ctx context.Context, i ipset.Interface, _ func(string)) error {
		if err := i.Add(ctx, "P", ipset.PortEntry(30010)); err != nil {
			return err
		}
		return i.Del(ctx, "P", ipset.PortEntry(30010))
	}, nil},
	{"delete a port that is not a member", del("P", ipset.PortEntry(30010)), ipset.ErrNotFound},

	{"create a set with room for two", create(ipset.Set{Name: "S", Type: ipset.HashIPPort, MaxElem: 2}), nil},
	{"fill it", func(ctx context.Context, i ipset.Interface, _ func(string)) error {
		for _, p := range []uint16{1, 2} {
			if err := i.Add(ctx, "S", ipset.IPPortEntry(a4, tcp, p)); err != nil {
				return err
			}
		}
		return nil
	}, nil},
	{"overfill it", add("S", ipset.IPPortEntry(a4, tcp, 3)), errAny},
	{"flush it", func(ctx context.Context, i ipset.Interface, _ func(string)) error { return i.Flush(ctx, "S") }, nil},
	{"add a hash:ip,port,ip entry to hash:ip,port", add("S", ipset.IPPortIPEntry(a4, tcp, 1, b4)), ipset.ErrInvalid},
}

// behaviourEnd is the state the behaviour table leaves.
const behaviourEnd = `create A hash:ip family inet hashsize 4096 maxelem 65536
add A 10.0.0.2
create A6 hash:ip family inet6 hashsize 1024 maxelem 65536
add A6 fd00::1
create N hash:net family inet hashsize 1024 maxelem 65536
add N 10.1.0.0/16
add N 10.9.0.1/32
create P bitmap:port range 30000-30010
add P 30001
create S hash:ip,port family inet hashsize 1024 maxelem 2
`

func runBehaviour(t *testing.T, iface ipset.Interface, ref referenceFunc) {
	ctx := context.Background()
	for _, s := range behaviour {
		err := s.do(ctx, iface, func(name string) { ref(t, name) })
		switch {
		case s.want == nil && err != nil:
			t.Errorf("%s: unexpected error %v", s.desc, err)
		case s.want == errAny && err == nil, s.want != nil && s.want != errAny && !errors.Is(err, s.want):
			t.Errorf("%s: got error %v, want %v", s.desc, err, s.want)
		}
	}
	got := dump(t, iface)
	if diff := cmp.Diff(behaviourEnd, got); diff != "" {
		t.Errorf("state after the behaviour table (-want +got):\n%s", diff)
	}
	sets, err := iface.ListSets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	refs := map[string]int{}
	for _, s := range sets {
		refs[s.Name] = s.References
	}
	if diff := cmp.Diff(map[string]int{"A": 1, "A6": 0, "N": 0, "P": 0, "S": 0}, refs); diff != "" {
		t.Errorf("references (-want +got):\n%s", diff)
	}
}

// dump renders every set of iface and its members in the format of
// ipsettest.Fake.Dump, through the Interface alone.
func dump(t *testing.T, iface ipset.Interface) string {
	t.Helper()
	ctx := context.Background()
	sets, err := iface.ListSets(ctx)
	if err != nil {
		t.Fatalf("ListSets: %v", err)
	}
	var b strings.Builder
	for _, s := range sets {
		fmt.Fprintf(&b, "create %s\n", s.Set)
		entries, err := iface.ListEntries(ctx, s.Name)
		if err != nil {
			t.Fatalf("ListEntries(%s): %v", s.Name, err)
		}
		if len(entries) != s.NumEntries {
			t.Errorf("%s: ListSets says %d entries, ListEntries returns %d", s.Name, s.NumEntries, len(entries))
		}
		slices.SortFunc(entries, ipset.Entry.Compare)
		for _, e := range entries {
			fmt.Fprintf(&b, "add %s %s\n", s.Name, e)
		}
	}
	return b.String()
}

func TestFakeBehaviour(t *testing.T) {
	f := ipsettest.NewFake()
	runBehaviour(t, f, func(t *testing.T, name string) {
		if err := f.Reference(name); err != nil {
			t.Fatal(err)
		}
	})
	if diff := cmp.Diff(behaviourEnd, f.Dump()); diff != "" {
		t.Errorf("Dump() differs from the state listed through the Interface (-want +got):\n%s", diff)
	}
}

func netipAddr(s string) netip.Addr     { return netip.MustParseAddr(s) }
func netipPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
