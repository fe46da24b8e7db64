package ipset

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"

	"k8s.io/klog/v2"
)

// Desired is a set as a caller wants it: its description and its members.
type Desired struct {
	// Set describes the set. Its name must start with the reconciler's
	// prefix.
	Set Set
	// Entries are the members. Order does not matter and duplicates are
	// ignored.
	Entries []Entry
}

// Result says what a [Reconciler.Reconcile] call did.
type Result struct {
	// Created counts sets that did not exist and were created.
	Created int
	// Swapped counts sets whose options changed and that were replaced by
	// a new set through a swap, with no moment where the name was missing.
	Swapped int
	// Recreated counts sets whose type or family changed, which the kernel
	// cannot swap, and that were destroyed and created again because
	// nothing referenced them.
	Recreated int
	// Destroyed counts owned sets that were not wanted and were destroyed,
	// temporary sets left behind by an interrupted call included. (The
	// old set of a swap is counted in Swapped.)
	Destroyed int
	// Added and Deleted count members added and deleted, in every set.
	Added, Deleted int
	// InUse names owned sets that are no longer wanted but could not be
	// destroyed because something (an iptables rule) still references
	// them. They are destroyed by a later call once unreferenced; this is
	// not an error.
	InUse []string
	// Writes is the number of calls that changed the kernel's state.
	Writes int
}

// Reconciler makes the ipsets whose names start with a prefix match a
// desired state with as few kernel operations as it can. It owns those
// sets: whatever it finds under the prefix that is not desired is
// destroyed. Sets without the prefix are never touched.
//
// A Reconciler keeps no state between calls: every call lists the kernel's
// sets, so it repairs changes made by others and survives restarts. Calls
// must not run concurrently with each other.
type Reconciler struct {
	iface  Interface
	prefix string
}

// NewReconciler returns a reconciler of the sets of iface whose names start
// with prefix. An empty prefix makes every call fail, since it would claim
// every set on the node.
func NewReconciler(iface Interface, prefix string) *Reconciler {
	return &Reconciler{iface: iface, prefix: prefix}
}

// tempName returns the name of the temporary set used to replace the set
// name. It starts with the prefix, so one left behind by a crash is
// destroyed by the next call.
func (r *Reconciler) tempName(name string) string {
	h := fnv.New32a()
	h.Write([]byte(name))
	return fmt.Sprintf("%stmp-%08x", r.prefix, h.Sum32())
}

// Reconcile makes the owned sets equal to desired:
//
//   - a missing set is created and filled;
//   - an existing set whose options still fit ([Set.Replaces] is false)
//     gets exactly the missing members added and the extra ones deleted;
//   - a set whose options changed is rebuilt under a temporary name and
//     swapped in, so that rules matching on it never see a missing or
//     half-filled set; if its element kind or family changed, which the
//     kernel cannot swap, it is destroyed and created again when nothing
//     references it, and left alone with an error when something does;
//   - owned sets that are not desired are destroyed, except those still
//     referenced, which are reported in [Result.InUse].
//
// Invalid input is skipped, not applied: a desired set whose description
// is invalid, whose name lacks the prefix or appears twice is left as it
// is in the kernel, and a malformed entry or one that does not fit its set
// is left out of that set; the others are reconciled and the returned
// error names every skipped item. Kernel errors for one set do not stop the
// others either; they are joined in the returned error.
func (r *Reconciler) Reconcile(ctx context.Context, desired []Desired) (Result, error) {
	var res Result
	if r.prefix == "" {
		return res, fmt.Errorf("ipset reconciler: %w: empty prefix would claim every set", ErrInvalid)
	}
	logger := klog.FromContext(ctx)
	var errs []error

	wanted := make(map[string]bool, len(desired))
	var valid []*Desired
	for i := range desired {
		d := &desired[i]
		name := d.Set.Name
		switch err := d.Set.Validate(); {
		case err != nil:
			errs = append(errs, err)
			continue
		case !strings.HasPrefix(name, r.prefix):
			errs = append(errs, fmt.Errorf("ipset %s: %w: name does not start with the reconciler's prefix %q", name, ErrInvalid, r.prefix))
			continue
		case wanted[name]:
			errs = append(errs, fmt.Errorf("ipset %s: %w: desired twice", name, ErrInvalid))
			continue
		}
		wanted[name] = true
		valid = append(valid, d)
	}

	sets, err := r.iface.ListSets(ctx)
	if err != nil {
		return res, err
	}
	have := make(map[string]SetInfo, len(sets))
	for _, s := range sets {
		have[s.Name] = s
	}

	slices.SortFunc(valid, func(a, b *Desired) int { return strings.Compare(a.Set.Name, b.Set.Name) })
	for _, d := range valid {
		entries, bad := checkEntries(d)
		errs = append(errs, bad...)
		if err := r.reconcileSet(ctx, d.Set, entries, have, wanted, &res); err != nil {
			errs = append(errs, err)
		}
	}

	for _, s := range sets {
		if !strings.HasPrefix(s.Name, r.prefix) || wanted[s.Name] {
			continue
		}
		// A temporary set destroyed during this call is gone already;
		// destroying it again is a harmless no-op, but skip the write.
		if _, ok := have[s.Name]; !ok {
			continue
		}
		res.Writes++
		switch err := r.iface.Destroy(ctx, s.Name); {
		case IsInUse(err):
			logger.V(2).Info("Owned ipset is not wanted but still referenced; destroying it later", "set", s.Name, "references", s.References)
			res.InUse = append(res.InUse, s.Name)
		case err != nil:
			errs = append(errs, err)
		default:
			res.Destroyed++
		}
	}
	return res, errors.Join(errs...)
}

// checkEntries returns the distinct valid entries of d and an error for
// each one that is malformed or does not fit d's set.
func checkEntries(d *Desired) (map[Entry]struct{}, []error) {
	entries := make(map[Entry]struct{}, len(d.Entries))
	var errs []error
	for _, e := range d.Entries {
		if err := d.Set.Check(e); err != nil {
			errs = append(errs, err)
			continue
		}
		entries[e] = struct{}{}
	}
	return entries, errs
}

func (r *Reconciler) reconcileSet(ctx context.Context, want Set, entries map[Entry]struct{}, have map[string]SetInfo, wanted map[string]bool, res *Result) error {
	cur, exists := have[want.Name]
	switch {
	case !exists:
		if err := r.createFilled(ctx, want, entries, res); err != nil {
			return err
		}
		res.Created++
		return nil
	case !want.Replaces(cur.Set):
		return r.sync(ctx, want.Name, entries, res)
	case Swappable(want, cur.Set):
		return r.swapIn(ctx, want, entries, have, wanted, res)
	case cur.References == 0:
		res.Writes++
		if err := r.iface.Destroy(ctx, want.Name); err != nil {
			return err
		}
		if err := r.createFilled(ctx, want, entries, res); err != nil {
			return err
		}
		res.Recreated++
		return nil
	default:
		return fmt.Errorf("ipset %s: %w: changing %s into %s needs a new set, which the kernel cannot swap in for a set of another element kind or family, and %d references hold the old one; remove the rules that match on it first",
			want.Name, ErrTypeMismatch, cur.Set, want.WithDefaults(), cur.References)
	}
}

// createFilled creates set and adds entries to it.
func (r *Reconciler) createFilled(ctx context.Context, set Set, entries map[Entry]struct{}, res *Result) error {
	res.Writes++
	if err := r.iface.Create(ctx, set); err != nil {
		return err
	}
	for e := range entries {
		res.Writes++
		if err := r.iface.Add(ctx, set.Name, e); err != nil {
			return err
		}
		res.Added++
	}
	return nil
}

// sync adds and deletes members of an existing set so that it holds
// exactly entries.
func (r *Reconciler) sync(ctx context.Context, name string, entries map[Entry]struct{}, res *Result) error {
	current, err := r.iface.ListEntries(ctx, name)
	if err != nil {
		return err
	}
	present := make(map[Entry]struct{}, len(current))
	var errs []error
	// Deletions first, so that a full set has room for the additions.
	for _, e := range current {
		present[e] = struct{}{}
		if _, ok := entries[e]; ok {
			continue
		}
		res.Writes++
		if err := r.iface.Del(ctx, name, e); err != nil {
			errs = append(errs, err)
			continue
		}
		res.Deleted++
	}
	for e := range entries {
		if _, ok := present[e]; ok {
			continue
		}
		res.Writes++
		if err := r.iface.Add(ctx, name, e); err != nil {
			errs = append(errs, err)
			continue
		}
		res.Added++
	}
	return errors.Join(errs...)
}

// swapIn builds want under a temporary name, swaps it with the existing set
// and destroys the old one, now under the temporary name.
func (r *Reconciler) swapIn(ctx context.Context, want Set, entries map[Entry]struct{}, have map[string]SetInfo, wanted map[string]bool, res *Result) error {
	tmp := r.tempName(want.Name)
	if len(tmp) > MaxNameLen || wanted[tmp] {
		return fmt.Errorf("ipset %s: %w: cannot name a temporary set to swap in new options (prefix %q too long, or %s is a desired set)", want.Name, ErrInvalid, r.prefix, tmp)
	}
	if _, ok := have[tmp]; ok {
		// Left behind by an interrupted swap.
		res.Writes++
		if err := r.iface.Destroy(ctx, tmp); err != nil {
			return err
		}
		delete(have, tmp)
		res.Destroyed++
	}
	tmpSet := want
	tmpSet.Name = tmp
	if err := r.createFilled(ctx, tmpSet, entries, res); err != nil {
		return err
	}
	res.Writes++
	if err := r.iface.Swap(ctx, want.Name, tmp); err != nil {
		return err
	}
	res.Writes++
	if err := r.iface.Destroy(ctx, tmp); err != nil {
		return err
	}
	res.Swapped++
	return nil
}
