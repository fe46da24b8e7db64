// Package ipsettest provides a strict in-memory fake of [ipset.Interface] for
// unit tests of code that manages ipsets.
package ipsettest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/proxykit/proxykit/ipset"
)

// Fake is an in-memory [ipset.Interface] that checks what the kernel checks
// and fails where the kernel fails, with the same error kinds
// ([ipset.ErrNotFound], [ipset.ErrAlreadyExists], [ipset.ErrInUse],
// [ipset.ErrTypeMismatch], [ipset.ErrInvalid]): names and entries are
// validated, entries must fit their set's type, family and port range, a
// hash set refuses members beyond its maximum, a referenced set cannot be
// destroyed, and only sets of the same element kind and family can be
// swapped. It is stricter than the kernel in one way: an entry whose Type
// differs from the set's is always refused, where the kernel reads a few
// such entries as something else (a hash:ip entry added to a hash:net set
// becomes a /32 network).
//
// Hash sizes are kept as created (rounded as the kernel rounds them); the
// fake does not grow them. References stand for iptables rules that match
// on a set; add them with [Fake.Reference].
//
// The zero value is not usable; make one with [NewFake]. It is safe for
// concurrent use.
type Fake struct {
	mu      sync.Mutex
	sets    map[string]*fakeSet
	refs    map[string]int
	counts  Counts
	version ipset.Version
}

type fakeSet struct {
	set     ipset.Set
	entries map[ipset.Entry]struct{}
}

var _ ipset.Interface = (*Fake)(nil)

// Counts is the number of calls of each kind that a [Fake] served since it
// was made or last reset, failed calls included, calls refused before
// reaching the "kernel" (invalid names or entries) excluded.
type Counts struct {
	// Writes, by method.
	Create, Destroy, Flush, Swap, Add, Del int
	// Reads, by method.
	Test, ListEntries, ListSets, Version int
}

// Writes returns the number of calls that change state (or try to).
func (c Counts) Writes() int { return c.Create + c.Destroy + c.Flush + c.Swap + c.Add + c.Del }

// NewFake returns an empty fake that reports protocol version 7 (minimum 6),
// as current kernels do.
func NewFake() *Fake {
	return &Fake{
		sets:    map[string]*fakeSet{},
		refs:    map[string]int{},
		version: ipset.Version{Protocol: 7, MinProtocol: 6},
	}
}

// Counts returns the calls served so far.
func (f *Fake) Counts() Counts {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts
}

// ResetCounts sets every count back to zero.
func (f *Fake) ResetCounts() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts = Counts{}
}

// Reference adds a kernel reference to the named set, as an iptables rule
// with "-m set --match-set NAME" does: the set cannot be destroyed until
// [Fake.Unreference] removes it. It returns an error wrapping
// [ipset.ErrNotFound] if the set does not exist. References belong to the
// name and stay with it across swaps.
func (f *Fake) Reference(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.sets[name]; !ok {
		return fmt.Errorf("ipset %s: referencing: %w", name, ipset.ErrNotFound)
	}
	f.refs[name]++
	return nil
}

// Unreference removes one reference added by [Fake.Reference]; it does
// nothing if the set has none.
func (f *Fake) Unreference(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refs[name] > 0 {
		f.refs[name]--
	}
}

// Create is part of [ipset.Interface].
func (f *Fake) Create(ctx context.Context, set ipset.Set) error {
	if err := set.Validate(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts.Create++
	if _, ok := f.sets[set.Name]; ok {
		return fmt.Errorf("ipset %s: creating: %w", set.Name, ipset.ErrAlreadyExists)
	}
	f.sets[set.Name] = &fakeSet{set: set.WithDefaults(), entries: map[ipset.Entry]struct{}{}}
	return nil
}

// Destroy is part of [ipset.Interface].
func (f *Fake) Destroy(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts.Destroy++
	if _, ok := f.sets[name]; !ok {
		return nil
	}
	if f.refs[name] > 0 {
		return fmt.Errorf("ipset %s: destroying: %w: %d references", name, ipset.ErrInUse, f.refs[name])
	}
	delete(f.sets, name)
	return nil
}

// Flush is part of [ipset.Interface].
func (f *Fake) Flush(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts.Flush++
	s, ok := f.sets[name]
	if !ok {
		return fmt.Errorf("ipset %s: flushing: %w", name, ipset.ErrNotFound)
	}
	clear(s.entries)
	return nil
}

// Swap is part of [ipset.Interface].
func (f *Fake) Swap(ctx context.Context, a, b string) error {
	if err := checkName(a); err != nil {
		return err
	}
	if err := checkName(b); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts.Swap++
	sa, okA := f.sets[a]
	sb, okB := f.sets[b]
	switch {
	case !okA:
		return fmt.Errorf("ipset %s: swapping with %s: %w", a, b, ipset.ErrNotFound)
	case !okB:
		return fmt.Errorf("ipset %s: swapping with %s: %w: %s", a, b, ipset.ErrNotFound, b)
	case !ipset.Swappable(sa.set, sb.set):
		return fmt.Errorf("ipset %s: swapping with %s: %w: %s and %s", a, b, ipset.ErrTypeMismatch, sa.set.Type, sb.set.Type)
	}
	sa.set.Name, sb.set.Name = b, a
	f.sets[a], f.sets[b] = sb, sa
	return nil
}

// Add is part of [ipset.Interface].
func (f *Fake) Add(ctx context.Context, name string, entry ipset.Entry) error {
	s, err := f.lookupEntry(name, entry, &f.counts.Add)
	defer f.mu.Unlock()
	if err != nil {
		return fmt.Errorf("ipset %s: adding %s: %w", name, entry, err)
	}
	if _, ok := s.entries[entry]; ok {
		return fmt.Errorf("ipset %s: adding %s: %w", name, entry, ipset.ErrAlreadyExists)
	}
	if s.set.Type.IsHash() && uint32(len(s.entries)) >= s.set.MaxElem {
		return fmt.Errorf("ipset %s: adding %s: the set is full (maxelem %d)", name, entry, s.set.MaxElem)
	}
	s.entries[entry] = struct{}{}
	return nil
}

// Del is part of [ipset.Interface].
func (f *Fake) Del(ctx context.Context, name string, entry ipset.Entry) error {
	s, err := f.lookupEntry(name, entry, &f.counts.Del)
	defer f.mu.Unlock()
	if err != nil {
		return fmt.Errorf("ipset %s: deleting %s: %w", name, entry, err)
	}
	if _, ok := s.entries[entry]; !ok {
		return fmt.Errorf("ipset %s: deleting %s: %w: not a member", name, entry, ipset.ErrNotFound)
	}
	delete(s.entries, entry)
	return nil
}

// Test is part of [ipset.Interface].
func (f *Fake) Test(ctx context.Context, name string, entry ipset.Entry) (bool, error) {
	s, err := f.lookupEntry(name, entry, &f.counts.Test)
	defer f.mu.Unlock()
	if err != nil {
		return false, fmt.Errorf("ipset %s: testing %s: %w", name, entry, err)
	}
	_, ok := s.entries[entry]
	return ok, nil
}

// lookupEntry validates entry, locks f (the caller unlocks it, whatever
// the result), counts the call and finds the set, checking that the entry
// fits it.
func (f *Fake) lookupEntry(name string, entry ipset.Entry, counter *int) (*fakeSet, error) {
	err := checkName(name)
	if err == nil {
		err = entry.Validate()
	}
	f.mu.Lock()
	if err != nil {
		return nil, err
	}
	*counter++
	s, ok := f.sets[name]
	if !ok {
		return nil, ipset.ErrNotFound
	}
	if err := s.set.Check(entry); err != nil {
		return nil, err
	}
	return s, nil
}

// ListEntries is part of [ipset.Interface]. The fake returns the members
// sorted by [ipset.Entry.Compare].
func (f *Fake) ListEntries(ctx context.Context, name string) ([]ipset.Entry, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts.ListEntries++
	s, ok := f.sets[name]
	if !ok {
		return nil, fmt.Errorf("ipset %s: listing: %w", name, ipset.ErrNotFound)
	}
	return sortedEntries(s), nil
}

func sortedEntries(s *fakeSet) []ipset.Entry {
	entries := make([]ipset.Entry, 0, len(s.entries))
	for e := range s.entries {
		entries = append(entries, e)
	}
	slices.SortFunc(entries, ipset.Entry.Compare)
	return entries
}

// ListSets is part of [ipset.Interface].
func (f *Fake) ListSets(ctx context.Context) ([]ipset.SetInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts.ListSets++
	infos := make([]ipset.SetInfo, 0, len(f.sets))
	for name, s := range f.sets {
		infos = append(infos, ipset.SetInfo{Set: s.set, NumEntries: len(s.entries), References: f.refs[name]})
	}
	slices.SortFunc(infos, func(a, b ipset.SetInfo) int { return strings.Compare(a.Name, b.Name) })
	return infos, nil
}

// Version is part of [ipset.Interface].
func (f *Fake) Version(ctx context.Context) (ipset.Version, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts.Version++
	return f.version, nil
}

func checkName(name string) error {
	return ipset.Set{Name: name, Type: ipset.HashIP}.Validate()
}

// Dump returns the whole state in the format of `ipset save`, sorted: for
// each set by name, a "create" line with every option, then an "add" line
// per member in the order of [ipset.Entry.Compare].
//
//	create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536
//	add KUBE-CLUSTER-IP 10.96.0.1,tcp:443
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := make([]string, 0, len(f.sets))
	for name := range f.sets {
		names = append(names, name)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, name := range names {
		s := f.sets[name]
		fmt.Fprintf(&b, "create %s\n", s.set)
		for _, e := range sortedEntries(s) {
			fmt.Fprintf(&b, "add %s %s\n", name, e)
		}
	}
	return b.String()
}

// Restore creates sets and adds members from text in the format [Fake.Dump]
// writes ("create NAME TYPE [family F] [hashsize N] [maxelem N] [range
// A-B]" and "add NAME ENTRY" lines; blank lines and lines starting with #
// are skipped), with the same checks as [Fake.Create] and [Fake.Add]. It
// stops at the first bad line and returns an error naming it. Counts are
// not changed.
func (f *Fake) Restore(text string) error {
	saved := f.Counts()
	defer func() {
		f.mu.Lock()
		f.counts = saved
		f.mu.Unlock()
	}()
	ctx := context.Background()
	for i, line := range strings.Split(text, "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		if err := f.restoreLine(ctx, fields); err != nil {
			return fmt.Errorf("line %d %q: %w", i+1, line, err)
		}
	}
	return nil
}

func (f *Fake) restoreLine(ctx context.Context, fields []string) error {
	switch {
	case fields[0] == "add" && len(fields) == 3:
		f.mu.Lock()
		s, ok := f.sets[fields[1]]
		var t ipset.Type
		if ok {
			t = s.set.Type
		}
		f.mu.Unlock()
		if !ok {
			return fmt.Errorf("ipset %s: %w", fields[1], ipset.ErrNotFound)
		}
		e, err := ipset.ParseEntry(t, fields[2])
		if err != nil {
			return err
		}
		return f.Add(ctx, fields[1], e)
	case fields[0] == "create" && len(fields) >= 3 && len(fields)%2 == 1:
		set := ipset.Set{Name: fields[1], Type: ipset.Type(fields[2])}
		for i := 3; i < len(fields); i += 2 {
			if err := setOption(&set, fields[i], fields[i+1]); err != nil {
				return err
			}
		}
		return f.Create(ctx, set)
	}
	return fmt.Errorf("not a create or add line")
}

func setOption(set *ipset.Set, key, value string) error {
	number := func() (uint32, error) {
		n, err := strconv.ParseUint(value, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("%s %q is not a number", key, value)
		}
		return uint32(n), nil
	}
	var err error
	switch key {
	case "family":
		set.Family = ipset.Family(value)
	case "hashsize":
		set.HashSize, err = number()
	case "maxelem":
		set.MaxElem, err = number()
	case "range":
		from, to, ok := strings.Cut(value, "-")
		a, errA := strconv.ParseUint(from, 10, 16)
		b, errB := strconv.ParseUint(to, 10, 16)
		if !ok || errA != nil || errB != nil {
			return fmt.Errorf("range %q is not PORT-PORT", value)
		}
		set.PortFrom, set.PortTo = uint16(a), uint16(b)
	default:
		return fmt.Errorf("unknown option %q", key)
	}
	return err
}
