package nftmeasure

import (
	"errors"
	"fmt"
	"time"

	"github.com/google/nftables"
)

// Watcher follows the batches committed to the nf_tables ruleset of a
// namespace (nf_tables' monitor multicast group), so that a resync checks
// only what others changed in Table rather than the whole table: the
// writer tells it which generations were its own (Own), and Until returns
// the Scope of the rest.
type Watcher struct {
	mon    *nftables.Monitor
	events chan *nftables.MonitorEvents
	own    map[uint32]bool
}

// Watch starts a Watcher on conn's namespace. Every commit in the
// namespace then also costs the kernel the notifications, one message per
// object changed. It fails if the monitor group cannot be joined.
func Watch(conn *nftables.Conn) (*Watcher, error) {
	mon := nftables.NewMonitor(nftables.WithMonitorEventBuffer(1 << 16))
	events, err := conn.AddGenerationalMonitor(mon)
	if err != nil {
		return nil, fmt.Errorf("joining the nf_tables monitor: %w", err)
	}
	return &Watcher{mon: mon, events: events, own: map[uint32]bool{}}, nil
}

// Close stops the Watcher.
func (w *Watcher) Close() error { return w.mon.Close() }

// Own records that the batch of generation gen was the writer's: a writer
// that read the generation before (g0) and after (g1) its commit calls Own(g1)
// when g1 == g0+1, and otherwise nothing (another commit came between, so
// its own is checked as foreign: conservative).
func (w *Watcher) Own(gen uint32) { w.own[gen] = true }

// ErrEventsLost is Until's error when the monitor could not read every
// event (its socket overflowed, or it closed): the caller falls back to a
// whole-table DetectDrift.
var ErrEventsLost = errors.New("nf_tables monitor events lost")

// Until reads the batches committed up to generation gen (the one
// nftables.KernelState's Generation returned) and returns the Scope of what batches other than
// the writer's own changed in Table, and whether anything did. A set or
// the table created or deleted by others has no narrower scope than the
// whole table: Until then returns a nil Scope and true. It fails with
// ErrEventsLost when events were lost, and with an error when gen's batch
// does not come within timeout.
func (w *Watcher) Until(gen uint32, timeout time.Duration) (*Scope, bool, error) {
	scope := &Scope{Chains: map[string]bool{}, EndpointKeys: map[string]bool{}}
	changed, whole := false, false
	deadline := time.After(timeout)
	for {
		var batch *nftables.MonitorEvents
		var ok bool
		select {
		case batch, ok = <-w.events:
		case <-deadline:
			return nil, false, fmt.Errorf("no batch of generation %d within %v", gen, timeout)
		}
		if !ok {
			return nil, false, ErrEventsLost
		}
		if batch.GeneratedBy.Error != nil {
			return nil, false, fmt.Errorf("%w: %v", ErrEventsLost, batch.GeneratedBy.Error)
		}
		g, _ := batch.GeneratedBy.Data.(*nftables.GenMsg)
		if g == nil {
			return nil, false, fmt.Errorf("%w: a batch without its generation", ErrEventsLost)
		}
		if !w.own[g.ID] {
			for _, e := range batch.Changes {
				if scopeEvent(scope, e) {
					changed = true
				} else if touchesTable(e) {
					changed, whole = true, true
				}
			}
		}
		delete(w.own, g.ID)
		if g.ID == gen {
			if whole {
				return nil, true, nil
			}
			return scope, changed, nil
		}
	}
}

// scopeEvent adds to scope the chain or the elements that e changed in
// Table, and reports whether it did. Element events do not name their set
// (the library drops it): a 16-byte key is EndpointsDataMap's, any other
// asks for the small sets to be read, whichever table it came from.
func scopeEvent(scope *Scope, e *nftables.MonitorEvent) bool {
	switch d := e.Data.(type) {
	case *nftables.Chain:
		if d.Table != nil && d.Table.Name == Table {
			scope.Chains[d.Name] = true
			return true
		}
	case *nftables.Rule:
		if d.Table != nil && d.Table.Name == Table && d.Chain != nil {
			scope.Chains[d.Chain.Name] = true
			return true
		}
	case []nftables.SetElement:
		for _, el := range d {
			if len(el.Key) == 16 {
				scope.EndpointKeys[string(el.Key)] = true
			} else {
				scope.SmallSets = true
			}
		}
		return len(d) > 0
	}
	return false
}

// touchesTable reports whether e creates or deletes Table or one of its
// sets.
func touchesTable(e *nftables.MonitorEvent) bool {
	switch d := e.Data.(type) {
	case *nftables.Table:
		return d.Name == Table
	case *nftables.Set:
		return d.Table != nil && d.Table.Name == Table
	}
	return false
}
