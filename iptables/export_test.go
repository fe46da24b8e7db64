package iptables

import "context"

// Internals of Mode that its tests, in package iptables_test (which
// imports iptablestest, and so cannot be package iptables), reach.

// CheckDrift runs one drift check of m, as Run does every period.
func (m *Mode) CheckDrift(ctx context.Context, lost func()) { m.checkDrift(ctx, lost) }

// SetInterface replaces the Interface m applies and reads through.
func (m *Mode) SetInterface(ipt Interface) { m.ipt = ipt }

// RuleTally is Mode's count of the rules of applied payloads, for its
// benchmark.
type RuleTally = ruleTally

// Note is note.
func (t *ruleTally) Note(payload []byte, full bool) map[Table]int { return t.note(payload, full) }

// SetRuleTally makes w count the rules of each applied payload into t, as
// a Mode's writer counts them into the Mode's tally.
func SetRuleTally(w *Writer, t *RuleTally) { w.tally = t }
