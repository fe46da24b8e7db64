package nftables

import (
	"strings"

	"sigs.k8s.io/knftables"
)

// elemTable is the writer's memory of one of its top-level sets or maps:
// for each key, which service ports claim it with which value, and what
// the kernel holds. It is what lets a partial sync touch only the elements
// of the ports it rewrites, and never flush the map.
//
// Two ports may claim one key: every port of a Service claims its cluster
// IP in cluster-ips, and two Services may list the same external IP and
// port. The first claim holds the element; when its port lets go, the
// next claim takes over in the same sync.
type elemTable struct {
	name    string
	isMap   bool
	entries map[string]*elemEntry
	dirty   []*elemEntry
	// counts, for a verdict map, counts the elements the kernel will hold
	// per shared chain they go to (see isSharedChain); nil for others.
	counts map[string]int
	// entrySlab and claimSlab are what new entries and their first
	// claims are carved from, so that a full sync of a large table makes
	// a few allocations per thousand elements instead of two each (the
	// collector's work grows with their number). A slab lives while one
	// of its entries does.
	entrySlab []elemEntry
	claimSlab []elemClaim
}

// slabSize is the number of entries (and claims) allocated at once.
const slabSize = 256

// newEntry returns a zero entry from the slab.
func (t *elemTable) newEntry() *elemEntry {
	if len(t.entrySlab) == 0 {
		t.entrySlab = make([]elemEntry, slabSize)
	}
	e := &t.entrySlab[0]
	t.entrySlab = t.entrySlab[1:]
	return e
}

// firstClaim returns an empty claims slice of capacity one from the slab:
// most keys have one claim, and a second one grows it as append does.
func (t *elemTable) firstClaim() []elemClaim {
	if len(t.claimSlab) == 0 {
		t.claimSlab = make([]elemClaim, slabSize)
	}
	c := t.claimSlab[:0:1]
	t.claimSlab = t.claimSlab[1:]
	return c
}

// presize makes an empty table's map room for n entries, so that a first
// full sync does not grow it from empty.
func (t *elemTable) presize(n int) {
	if len(t.entries) == 0 && n > 8 {
		t.entries = make(map[string]*elemEntry, n)
		if cap(t.dirty) < n {
			t.dirty = make([]*elemEntry, 0, n)
		}
	}
}

type elemEntry struct {
	key    string // the key's parts joined by " . ", as nft writes them
	parts  []string
	claims []elemClaim
	// inKernel says whether the element is in the kernel, with written's
	// value and comment.
	inKernel bool
	written  elemClaim
	isDirty  bool
	// seen marks, during readBack, an entry the kernel's listing held.
	seen bool
}

type elemClaim struct {
	owner *portState
	gen   uint64
	// value is the map element's value as nft writes it; parts, when
	// not nil, is the same value split at its concatenation.
	value   string
	parts   []string
	comment *string
}

func newElemTable(name string, isMap bool) *elemTable {
	return &elemTable{name: name, isMap: isMap, entries: make(map[string]*elemEntry)}
}

// claim records that owner wants key (with value, for a map) in the table
// as of sync gen, and remembers the claim in owner.
func (t *elemTable) claim(owner *portState, gen uint64, parts []string, value string, valueParts []string, comment *string) {
	t.claimKey(owner, gen, strings.Join(parts, " . "), parts, value, valueParts, comment)
}

// claimKey is claim with the key's parts joined already.
func (t *elemTable) claimKey(owner *portState, gen uint64, key string, parts []string, value string, valueParts []string, comment *string) {
	e := t.entries[key]
	if e == nil {
		e = t.add(key, parts)
	}
	t.claimEntry(e, owner, gen, value, valueParts, comment)
}

// add makes the entry of key, whose parts are parts.
func (t *elemTable) add(key string, parts []string) *elemEntry {
	e := t.newEntry()
	e.key, e.parts, e.claims = key, parts, t.firstClaim()
	t.entries[key] = e
	return e
}

// claimEntry is claim of the entry e.
func (t *elemTable) claimEntry(e *elemEntry, owner *portState, gen uint64, value string, valueParts []string, comment *string) {
	for i := range e.claims {
		if e.claims[i].owner == owner {
			if e.claims[i].gen != gen {
				e.claims[i] = elemClaim{owner: owner, gen: gen, value: value, parts: valueParts, comment: comment}
				t.markDirty(e)
				return
			}
			// A port claiming one key twice (two equal external IPs):
			// the first value stands.
			return
		}
	}
	e.claims = append(e.claims, elemClaim{owner: owner, gen: gen, value: value, parts: valueParts, comment: comment})
	owner.claims = append(owner.claims, claimRef{table: t, entry: e})
	t.markDirty(e)
}

// releaseStale drops owner's claims older than gen.
func releaseStale(owner *portState, gen uint64) {
	kept := owner.claims[:0]
	for _, r := range owner.claims {
		e := r.entry
		stale := false
		for i := range e.claims {
			if e.claims[i].owner == owner && e.claims[i].gen != gen {
				e.claims = append(e.claims[:i], e.claims[i+1:]...)
				r.table.markDirty(e)
				stale = true
				break
			}
		}
		if !stale {
			kept = append(kept, r)
		}
	}
	clear(owner.claims[len(kept):])
	owner.claims = kept
}

func (t *elemTable) markDirty(e *elemEntry) {
	if !e.isDirty {
		e.isDirty = true
		t.dirty = append(t.dirty, e)
	}
}

// element makes the knftables element of e for claim c, carved from the
// writer's slab: the transactions hold them, and none is changed once
// made.
func (t *elemTable) element(w *Writer, e *elemEntry, c *elemClaim) *knftables.Element {
	if len(w.elemSlab) == 0 {
		w.elemSlab = make([]knftables.Element, slabSize)
	}
	el := &w.elemSlab[0]
	w.elemSlab = w.elemSlab[1:]
	*el = knftables.Element{Family: w.family, Table: w.table, Key: e.parts, Comment: c.comment}
	if t.isMap {
		el.Map = t.name
		el.Value = c.parts
		if el.Value == nil {
			el.Value = []string{c.value}
		}
	} else {
		el.Set = t.name
	}
	return el
}

// diff appends to dels the deletions and to adds the additions that bring
// the kernel's elements of the dirty entries to their first claims, and
// forgets entries nobody claims. An element whose value changes is deleted
// and added again: the kernel refuses to add an element whose key exists
// with another value, even with "add".
func (t *elemTable) diff(w *Writer, dels, adds *[]op) {
	for _, e := range t.dirty {
		e.isDirty = false
		var want *elemClaim
		if len(e.claims) > 0 {
			want = &e.claims[0]
		}
		same := want != nil && e.inKernel && want.value == e.written.value && sameComment(want.comment, e.written.comment)
		if same {
			continue
		}
		if e.inKernel {
			*dels = append(*dels, op{verb: opDelete, obj: t.element(w, e, &e.written)})
			e.inKernel = false
			t.count(e.written.value, -1)
		}
		if want != nil {
			*adds = append(*adds, op{verb: opAdd, obj: t.element(w, e, want)})
			e.inKernel = true
			e.written = elemClaim{value: want.value, parts: want.parts, comment: want.comment}
			t.count(want.value, +1)
		} else {
			delete(t.entries, e.key)
		}
	}
	clear(t.dirty)
	t.dirty = t.dirty[:0]
}

// count adds d to the count of the shared chain a verdict goes to, if it
// goes to one.
func (t *elemTable) count(verdict string, d int) {
	if t.counts == nil {
		return
	}
	if chain, ok := strings.CutPrefix(verdict, "goto "); ok && isSharedChain(chain) {
		t.counts[chain] += d
	}
}

// reset forgets every entry, for a full sync that flushes the table and
// claims everything again in the order of the service ports' names, so
// that a full sync's outcome does not depend on the syncs before it.
func (t *elemTable) reset() {
	clear(t.counts)
	clear(t.entries)
	clear(t.dirty)
	t.dirty = t.dirty[:0]
}

// reclaimAll drops every claim and marks every entry dirty, keeping what
// the kernel holds: a full sync that keeps the elements claims everything
// again, in the order of the service ports' names as after reset, and the
// diff then sends only what differs from the kernel.
func (t *elemTable) reclaimAll() {
	if cap(t.dirty) < len(t.entries) {
		t.dirty = make([]*elemEntry, 0, len(t.entries))
	}
	for _, e := range t.entries {
		e.claims = e.claims[:0]
		t.markDirty(e)
	}
}

// readBack makes the table's memory of the kernel what the kernel's
// listing of the set or map, els, holds: an entry it lacks is not in the
// kernel, one it holds with another value or comment is, with that, and a
// key the writer does not know gets an entry with no claim, which the next
// diff deletes. It returns how many entries it changed or added.
func (t *elemTable) readBack(els []*knftables.Element) int {
	changed := 0
	for _, el := range els {
		key := strings.Join(el.Key, " . ")
		value := strings.Join(el.Value, " . ")
		e := t.entries[key]
		if e == nil {
			e = &elemEntry{key: key, parts: el.Key}
			t.entries[key] = e
		}
		e.seen = true
		if e.inKernel && e.written.value == value && sameComment(e.written.comment, el.Comment) {
			continue
		}
		if e.inKernel {
			t.count(e.written.value, -1)
		}
		e.inKernel = true
		e.written = elemClaim{value: value, parts: el.Value, comment: el.Comment}
		t.count(value, +1)
		changed++
	}
	for _, e := range t.entries {
		if !e.seen && e.inKernel {
			e.inKernel = false
			t.count(e.written.value, -1)
			changed++
		}
		e.seen = false
	}
	return changed
}

func sameComment(a, b *string) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

type claimRef struct {
	table *elemTable
	entry *elemEntry
}
