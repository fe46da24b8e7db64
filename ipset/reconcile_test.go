package ipset_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipset"
	"github.com/proxykit/proxykit/ipset/ipsettest"
)

const prefix = "PK-"

// tempName is the name the reconciler gives the set it builds to swap in
// for name.
func tempName(name string) string {
	h := fnv.New32a()
	h.Write([]byte(name))
	return fmt.Sprintf("%stmp-%08x", prefix, h.Sum32())
}

type reconcileCase struct {
	name    string
	start   string   // in Fake.Restore's format
	refs    []string // sets referenced by a rule before reconciling
	desired []ipset.Desired
	want    string // the state afterwards, in Fake.Dump's format
	result  ipset.Result
	err     error // nil, an error kind, or errAny
}

func svc(e ...ipset.Entry) ipset.Desired {
	return ipset.Desired{Set: ipset.Set{Name: "PK-SVC", Type: ipset.HashIPPort}, Entries: e}
}

var reconcileCases = []reconcileCase{{
	name:  "from nothing, leaving other sets alone",
	start: "create OTHER hash:ip\nadd OTHER 10.0.0.1\n",
	desired: []ipset.Desired{
		svc(ipset.IPPortEntry(a4, tcp, 80), ipset.IPPortEntry(a4, v1.ProtocolUDP, 53), ipset.IPPortEntry(a4, tcp, 80)),
		{Set: ipset.Set{Name: "PK-NETS", Type: ipset.HashNet}, Entries: []ipset.Entry{ipset.NetEntry(n4)}},
		{Set: ipset.Set{Name: "PK-NP", Type: ipset.BitmapPort, PortFrom: 30000, PortTo: 32767}, Entries: []ipset.Entry{ipset.PortEntry(30080)}},
		{Set: ipset.Set{Name: "PK-EMPTY", Type: ipset.HashIPPortNet, Family: ipset.FamilyIPv6}},
	},
	want: `create OTHER hash:ip family inet hashsize 1024 maxelem 65536
add OTHER 10.0.0.1
create PK-EMPTY hash:ip,port,net family inet6 hashsize 1024 maxelem 65536
create PK-NETS hash:net family inet hashsize 1024 maxelem 65536
add PK-NETS 10.1.0.0/16
create PK-NP bitmap:port range 30000-32767
add PK-NP 30080
create PK-SVC hash:ip,port family inet hashsize 1024 maxelem 65536
add PK-SVC 10.0.0.1,tcp:80
add PK-SVC 10.0.0.1,udp:53
`,
	result: ipset.Result{Created: 4, Added: 4, Writes: 8},
}, {
	name:    "converged: no writes",
	start:   "create PK-SVC hash:ip,port\nadd PK-SVC 10.0.0.1,tcp:80\n",
	desired: []ipset.Desired{svc(ipset.IPPortEntry(a4, tcp, 80))},
	want:    "create PK-SVC hash:ip,port family inet hashsize 1024 maxelem 65536\nadd PK-SVC 10.0.0.1,tcp:80\n",
}, {
	name:    "members differ: exactly the missing and extra ones",
	start:   "create PK-SVC hash:ip,port\nadd PK-SVC 10.0.0.1,tcp:80\nadd PK-SVC 10.0.0.2,tcp:80\n",
	desired: []ipset.Desired{svc(ipset.IPPortEntry(a4, tcp, 80), ipset.IPPortEntry(a4, v1.ProtocolSCTP, 80))},
	want:    "create PK-SVC hash:ip,port family inet hashsize 1024 maxelem 65536\nadd PK-SVC 10.0.0.1,sctp:80\nadd PK-SVC 10.0.0.1,tcp:80\n",
	result:  ipset.Result{Added: 1, Deleted: 1, Writes: 2},
}, {
	name:  "a larger hash size is swapped in under a rule's reference",
	start: "create PK-SVC hash:ip,port\nadd PK-SVC 10.0.0.1,tcp:80\n",
	refs:  []string{"PK-SVC"},
	desired: []ipset.Desired{{
		Set:     ipset.Set{Name: "PK-SVC", Type: ipset.HashIPPort, HashSize: 4096},
		Entries: []ipset.Entry{ipset.IPPortEntry(a4, tcp, 80), ipset.IPPortEntry(b4, tcp, 80)},
	}},
	want:   "create PK-SVC hash:ip,port family inet hashsize 4096 maxelem 65536\nadd PK-SVC 10.0.0.1,tcp:80\nadd PK-SVC 10.0.0.2,tcp:80\n",
	result: ipset.Result{Swapped: 1, Added: 2, Writes: 5},
}, {
	name:    "a smaller hash size than the kernel's is no change",
	start:   "create PK-SVC hash:ip,port hashsize 4096\nadd PK-SVC 10.0.0.1,tcp:80\n",
	desired: []ipset.Desired{svc(ipset.IPPortEntry(a4, tcp, 80))},
	want:    "create PK-SVC hash:ip,port family inet hashsize 4096 maxelem 65536\nadd PK-SVC 10.0.0.1,tcp:80\n",
}, {
	name:  "a new maximum is swapped in, replacing a temporary set left by a crash",
	start: "create PK-SVC hash:ip,port\nadd PK-SVC 10.0.0.1,tcp:80\ncreate " + tempName("PK-SVC") + " hash:ip,port\n",
	desired: []ipset.Desired{{
		Set:     ipset.Set{Name: "PK-SVC", Type: ipset.HashIPPort, MaxElem: 100},
		Entries: []ipset.Entry{ipset.IPPortEntry(a4, tcp, 80)},
	}},
	want:   "create PK-SVC hash:ip,port family inet hashsize 1024 maxelem 100\nadd PK-SVC 10.0.0.1,tcp:80\n",
	result: ipset.Result{Swapped: 1, Destroyed: 1, Added: 1, Writes: 5},
}, {
	name:  "a new port range is swapped in",
	start: "create PK-NP bitmap:port range 30000-32767\nadd PK-NP 30080\n",
	desired: []ipset.Desired{{
		Set:     ipset.Set{Name: "PK-NP", Type: ipset.BitmapPort},
		Entries: []ipset.Entry{ipset.PortEntry(30080), ipset.PortEntry(80)},
	}},
	want:   "create PK-NP bitmap:port range 0-65535\nadd PK-NP 80\nadd PK-NP 30080\n",
	result: ipset.Result{Swapped: 1, Added: 2, Writes: 5},
}, {
	name:    "a new type, unreferenced: destroyed and created again",
	start:   "create PK-X hash:ip\nadd PK-X 10.0.0.1\n",
	desired: []ipset.Desired{{Set: ipset.Set{Name: "PK-X", Type: ipset.HashNet}, Entries: []ipset.Entry{ipset.NetEntry(n4)}}},
	want:    "create PK-X hash:net family inet hashsize 1024 maxelem 65536\nadd PK-X 10.1.0.0/16\n",
	result:  ipset.Result{Recreated: 1, Added: 1, Writes: 3},
}, {
	name:    "a new family, unreferenced: destroyed and created again",
	start:   "create PK-X hash:ip\nadd PK-X 10.0.0.1\n",
	desired: []ipset.Desired{{Set: ipset.Set{Name: "PK-X", Type: ipset.HashIP, Family: ipset.FamilyIPv6}, Entries: []ipset.Entry{ipset.IPEntry(a6)}}},
	want:    "create PK-X hash:ip family inet6 hashsize 1024 maxelem 65536\nadd PK-X fd00::1\n",
	result:  ipset.Result{Recreated: 1, Added: 1, Writes: 3},
}, {
	name:  "a new type under a reference is refused; other sets still reconciled",
	start: "create PK-X hash:ip\nadd PK-X 10.0.0.1\ncreate PK-Y hash:ip\n",
	refs:  []string{"PK-X"},
	desired: []ipset.Desired{
		{Set: ipset.Set{Name: "PK-X", Type: ipset.HashNet}, Entries: []ipset.Entry{ipset.NetEntry(n4)}},
		{Set: ipset.Set{Name: "PK-Y", Type: ipset.HashIP}, Entries: []ipset.Entry{ipset.IPEntry(b4)}},
	},
	want:   "create PK-X hash:ip family inet hashsize 1024 maxelem 65536\nadd PK-X 10.0.0.1\ncreate PK-Y hash:ip family inet hashsize 1024 maxelem 65536\nadd PK-Y 10.0.0.2\n",
	result: ipset.Result{Added: 1, Writes: 1},
	err:    ipset.ErrTypeMismatch,
}, {
	name:   "owned sets not wanted are destroyed unless referenced; others stay",
	start:  "create PK-OLD hash:ip\nadd PK-OLD 10.0.0.1\ncreate PK-BUSY hash:net\ncreate OTHER hash:ip\ncreate PK-tmp-00000000 hash:ip\n",
	refs:   []string{"PK-BUSY"},
	want:   "create OTHER hash:ip family inet hashsize 1024 maxelem 65536\ncreate PK-BUSY hash:net family inet hashsize 1024 maxelem 65536\n",
	result: ipset.Result{Destroyed: 2, InUse: []string{"PK-BUSY"}, Writes: 3},
}, {
	name: "invalid input is skipped and reported; the rest is applied",
	desired: []ipset.Desired{
		{Set: ipset.Set{Name: "PK-A", Type: ipset.HashIP}, Entries: []ipset.Entry{
			ipset.IPEntry(a4),
			ipset.IPEntry(a6),                       // wrong family
			{Type: ipset.HashIP},                    // malformed
			ipset.IPPortEntry(b4, tcp, 80),          // wrong type
			{Type: ipset.HashIP, Addr: b4, Port: 1}, // malformed
		}},
		{Set: ipset.Set{Name: "PK-A", Type: ipset.HashNet}},     // twice
		{Set: ipset.Set{Name: "NOPREFIX", Type: ipset.HashIP}},  // not owned
		{Set: ipset.Set{Name: "PK-BAD", Type: ipset.Type("x")}}, // invalid
	},
	want:   "create PK-A hash:ip family inet hashsize 1024 maxelem 65536\nadd PK-A 10.0.0.1\n",
	result: ipset.Result{Created: 1, Added: 1, Writes: 2},
	err:    ipset.ErrInvalid,
}}

// runReconcileCase loads tc.start into iface, adds the references,
// reconciles and checks the result, the number of writes, the state, and
// that a second call changes nothing.
func runReconcileCase(t *testing.T, iface ipset.Interface, ref referenceFunc, tc reconcileCase) {
	t.Helper()
	ctx := context.Background()
	load(t, iface, tc.start)
	for _, name := range tc.refs {
		ref(t, name)
	}
	c := &counting{Interface: iface}
	r := ipset.NewReconciler(c, prefix)
	res, err := r.Reconcile(ctx, tc.desired)
	checkErr(t, err, tc.err)
	if diff := cmp.Diff(tc.result, res, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("Result (-want +got):\n%s", diff)
	}
	if c.writes != res.Writes {
		t.Errorf("%d writes reached the Interface, Result says %d", c.writes, res.Writes)
	}
	if diff := cmp.Diff(tc.want, dump(t, iface)); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
	c.writes = 0
	res, err = r.Reconcile(ctx, tc.desired)
	checkErr(t, err, tc.err)
	if c.writes != len(res.InUse) {
		t.Errorf("second call wrote %d times, want %d (one destroy attempt per set in use); result %+v", c.writes, len(res.InUse), res)
	}
}

func checkErr(t *testing.T, err, want error) {
	t.Helper()
	switch {
	case want == nil && err != nil:
		t.Errorf("unexpected error: %v", err)
	case want == errAny && err == nil, want != nil && want != errAny && !errors.Is(err, want):
		t.Errorf("got error %v, want %v", err, want)
	}
}

func TestFakeReconcile(t *testing.T) {
	for _, tc := range reconcileCases {
		t.Run(tc.name, func(t *testing.T) {
			f := ipsettest.NewFake()
			runReconcileCase(t, f, func(t *testing.T, name string) {
				if err := f.Reference(name); err != nil {
					t.Fatal(err)
				}
			}, tc)
		})
	}
}

func TestReconcileInvalidInputNamesEachItem(t *testing.T) {
	tc := reconcileCases[len(reconcileCases)-1]
	_, err := ipset.NewReconciler(ipsettest.NewFake(), prefix).Reconcile(context.Background(), tc.desired)
	for _, want := range []string{"fd00::1", "10.0.0.2,tcp:80", "PK-A: invalid: desired twice", "NOPREFIX", "PK-BAD"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error does not name %q: %v", want, err)
		}
	}
}

func TestReconcileEmptyPrefix(t *testing.T) {
	f := ipsettest.NewFake()
	if err := f.Restore("create A hash:ip\n"); err != nil {
		t.Fatal(err)
	}
	_, err := ipset.NewReconciler(f, "").Reconcile(context.Background(), nil)
	if !errors.Is(err, ipset.ErrInvalid) {
		t.Errorf("got %v, want ErrInvalid", err)
	}
	if f.Counts().Writes() != 0 || !strings.Contains(f.Dump(), "create A ") {
		t.Errorf("an empty prefix touched the sets:\n%s", f.Dump())
	}
}

// randomCase makes a random start state and a random desired state over a
// few sets and a small pool of members, and returns them with the number
// of writes the shortest way from one to the other takes.
func randomCase(rng *rand.Rand) (start string, refs []string, desired []ipset.Desired, minWrites int) {
	kinds := []ipset.Set{
		{Type: ipset.HashIP},
		{Type: ipset.HashIP, HashSize: 4096},
		{Type: ipset.HashIP, MaxElem: 1000},
		{Type: ipset.HashNet},
		{Type: ipset.HashIPPort},
		{Type: ipset.BitmapPort, PortFrom: 1, PortTo: 100},
	}
	member := func(s ipset.Set, i int) ipset.Entry {
		addr := netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)})
		switch s.Type {
		case ipset.HashNet:
			return ipset.NetEntry(netip.PrefixFrom(addr, 24+i%9))
		case ipset.HashIPPort:
			return ipset.IPPortEntry(addr, tcp, uint16(80+i%2))
		case ipset.BitmapPort:
			return ipset.PortEntry(uint16(i + 1))
		}
		return ipset.IPEntry(addr)
	}
	pick := func(s ipset.Set) map[ipset.Entry]bool {
		m := map[ipset.Entry]bool{}
		for i := range 12 {
			if rng.IntN(2) == 0 {
				m[member(s, i)] = true
			}
		}
		return m
	}
	var b strings.Builder
	for i := range 5 {
		name := fmt.Sprintf("PK-%d", i)
		var have ipset.Set
		var haveEntries map[ipset.Entry]bool
		exists := rng.IntN(4) != 0
		if exists {
			have = kinds[rng.IntN(len(kinds))]
			have.Name = name
			haveEntries = pick(have)
			fmt.Fprintf(&b, "create %s\n", have)
			for e := range haveEntries {
				fmt.Fprintf(&b, "add %s %s\n", name, e)
			}
		}
		if rng.IntN(5) == 0 { // not wanted
			if exists {
				minWrites++ // destroy
				if rng.IntN(2) == 0 {
					refs = append(refs, name)
				}
			}
			continue
		}
		want := kinds[rng.IntN(len(kinds))]
		want.Name = name
		wantEntries := pick(want)
		d := ipset.Desired{Set: want}
		for e := range wantEntries {
			d.Entries = append(d.Entries, e)
		}
		desired = append(desired, d)
		switch {
		case !exists:
			minWrites += 1 + len(wantEntries)
		case !want.Replaces(have):
			for e := range haveEntries {
				if !wantEntries[e] {
					minWrites++
				}
			}
			for e := range wantEntries {
				if !haveEntries[e] {
					minWrites++
				}
			}
			if rng.IntN(2) == 0 {
				refs = append(refs, name)
			}
		case ipset.Swappable(want, have):
			minWrites += 1 + len(wantEntries) + 2
			if rng.IntN(2) == 0 {
				refs = append(refs, name)
			}
		default: // unreferenced: destroy and create
			minWrites += 2 + len(wantEntries)
		}
	}
	return b.String(), refs, desired, minWrites
}

// runRandomCase checks that one reconcile from a random start state reaches
// the desired state with the minimal number of writes, and that a second
// one writes nothing.
func runRandomCase(t *testing.T, iface ipset.Interface, ref referenceFunc, seed uint64) {
	t.Helper()
	ctx := context.Background()
	start, refs, desired, minWrites := randomCase(rand.New(rand.NewPCG(seed, 7)))
	load(t, iface, start)
	for _, name := range refs {
		ref(t, name)
	}
	c := &counting{Interface: iface}
	r := ipset.NewReconciler(c, prefix)
	res, err := r.Reconcile(ctx, desired)
	if err != nil {
		t.Fatalf("Reconcile: %v\nstart:\n%s", err, start)
	}
	if c.writes != minWrites {
		t.Errorf("%d writes, want the minimum %d (result %+v)\nstart:\n%s", c.writes, minWrites, res, start)
	}
	sets, err := iface.ListSets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]ipset.SetInfo{}
	for _, s := range sets {
		have[s.Name] = s
	}
	for _, d := range desired {
		s, ok := have[d.Set.Name]
		if !ok || d.Set.Replaces(s.Set) {
			t.Errorf("%s: got %v, want %v", d.Set.Name, s.Set, d.Set.WithDefaults())
			continue
		}
		got, err := iface.ListEntries(ctx, d.Set.Name)
		if err != nil {
			t.Fatal(err)
		}
		less := func(a, b ipset.Entry) bool { return a.String() < b.String() }
		if diff := cmp.Diff(d.Entries, got, cmpopts.SortSlices(less), cmpopts.EquateEmpty(), cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})); diff != "" {
			t.Errorf("%s members (-want +got):\n%s", d.Set.Name, diff)
		}
		delete(have, d.Set.Name)
	}
	for name, s := range have {
		if !slices.Contains(res.InUse, name) || s.References == 0 {
			t.Errorf("set %s left behind (references %d, in use %v)", name, s.References, res.InUse)
		}
	}
	c.writes = 0
	if _, err := r.Reconcile(ctx, desired); err != nil {
		t.Fatal(err)
	}
	if c.writes != len(res.InUse) {
		t.Errorf("second call wrote %d times, want %d", c.writes, len(res.InUse))
	}
}

func TestFakeReconcileConvergesMinimally(t *testing.T) {
	for seed := range uint64(300) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			f := ipsettest.NewFake()
			runRandomCase(t, f, func(t *testing.T, name string) {
				if err := f.Reference(name); err != nil {
					t.Fatal(err)
				}
			}, seed)
		})
	}
}

// counting wraps an Interface and counts the calls that write.
type counting struct {
	ipset.Interface
	writes int
}

func (c *counting) Create(ctx context.Context, s ipset.Set) error {
	c.writes++
	return c.Interface.Create(ctx, s)
}

func (c *counting) Destroy(ctx context.Context, name string) error {
	c.writes++
	return c.Interface.Destroy(ctx, name)
}

func (c *counting) Flush(ctx context.Context, name string) error {
	c.writes++
	return c.Interface.Flush(ctx, name)
}

func (c *counting) Swap(ctx context.Context, a, b string) error {
	c.writes++
	return c.Interface.Swap(ctx, a, b)
}

func (c *counting) Add(ctx context.Context, name string, e ipset.Entry) error {
	c.writes++
	return c.Interface.Add(ctx, name, e)
}

func (c *counting) Del(ctx context.Context, name string, e ipset.Entry) error {
	c.writes++
	return c.Interface.Del(ctx, name, e)
}

// load creates the sets and members of a dump (Fake.Restore's format) in
// iface, through the Interface alone.
func load(t *testing.T, iface ipset.Interface, text string) {
	t.Helper()
	f := ipsettest.NewFake()
	if err := f.Restore(text); err != nil {
		t.Fatalf("bad start state: %v", err)
	}
	ctx := context.Background()
	sets, _ := f.ListSets(ctx)
	for _, s := range sets {
		if err := iface.Create(ctx, s.Set); err != nil {
			t.Fatalf("loading start state: %v", err)
		}
		entries, _ := f.ListEntries(ctx, s.Name)
		for _, e := range entries {
			if err := iface.Add(ctx, s.Name, e); err != nil {
				t.Fatalf("loading start state: %v", err)
			}
		}
	}
}
