package proxier

import (
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/proxykit/proxykit/healthz"
)

// familyShare is what the groups serving one IP family have in common: the
// family's health on the proxy health server and its per-family gauges,
// which each group's familyProxier reports to and which say how the
// family as a whole fares. With one group it passes each report through;
// with several, the family is as healthy and as recently synced as its
// slowest group, because traffic the lagging Backend handles is served by
// stale rules all the same.
type familyShare struct {
	family  v1.IPFamily
	health  *healthz.ProxyHealthServer // nil without a proxy health server
	metrics *metrics

	// events is held to deliver an event to the trackers of every group,
	// and read-held while a group takes its trackers' changes, so that a
	// group's sync holds either all of an event or none of it, and
	// applied can tell which events each group has applied. It guards
	// events and is taken before mu.
	events sync.RWMutex
	// delivered counts the events delivered.
	delivered uint64

	mu      sync.Mutex
	members []*familyProxier
	// triggers are the change trigger times taken by the first group's
	// syncs that other groups have yet to apply, in the order taken.
	triggers []pendingTrigger
}

// pendingTrigger is a change's trigger time, and the count of events
// delivered when the sync that applied it took the trackers' changes.
type pendingTrigger struct {
	at  time.Time
	seq uint64
}

func newFamilyShare(family v1.IPFamily, health *healthz.ProxyHealthServer, m *metrics) *familyShare {
	return &familyShare{family: family, health: health, metrics: m}
}

// join makes fp one of the groups serving the family.
func (s *familyShare) join(fp *familyProxier) {
	s.events.Lock()
	defer s.events.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.members = append(s.members, fp)
	fp.share = s
}

// queued records that fp has a change to sync.
func (s *familyShare) queued(fp *familyProxier) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if fp.pendingSince.IsZero() {
		fp.pendingSince = now
	}
	if s.health != nil {
		s.health.QueuedUpdate(s.family)
	}
}

// updated records a good sync of fp, which applied every change it had
// queued. The health server hears that the family is up to date once no
// group has a change left. While another group has, it hears it only
// when fp held the oldest change: its timeout then runs again from now,
// the closest the server's API comes to the oldest change left (which
// came after fp's), so that two groups that take turns under steady churn
// never look stuck while one that stops syncing does, within its own
// changes' age plus one sync of the other.
func (s *familyShare) updated(fp *familyProxier) {
	s.mu.Lock()
	defer s.mu.Unlock()
	since := fp.pendingSince
	fp.pendingSince = time.Time{}
	if s.health == nil {
		return
	}
	var oldestLeft time.Time
	for _, m := range s.members {
		if t := m.pendingSince; !t.IsZero() && (oldestLeft.IsZero() || t.Before(oldestLeft)) {
			oldestLeft = t
		}
	}
	switch {
	case oldestLeft.IsZero():
		s.health.Updated(s.family)
	case !since.IsZero() && !since.After(oldestLeft):
		s.health.Updated(s.family)
		s.health.QueuedUpdate(s.family)
	}
}

// syncedAt records fp's last good sync, ended at end, and sets the
// family's last-sync gauge to the oldest of its groups' last good syncs,
// once each has had one: an alert on the gauge's age then fires when any
// group stops syncing, as it does for kube-proxy's one proxier per family.
func (s *familyShare) syncedAt(fp *familyProxier, end time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fp.lastGoodSync = end
	oldest := end
	for _, m := range s.members {
		if m.lastGoodSync.IsZero() {
			return
		}
		if m.lastGoodSync.Before(oldest) {
			oldest = m.lastGoodSync
		}
	}
	s.metrics.lastSync.WithLabelValues(string(s.family)).Set(float64(oldest.UnixNano()) / 1e9)
}

// noLocalEndpoints records the counts of fp's last good sync and sets the
// family's gauges to the largest of its groups': every group renders the
// same maps, and a Backend that does not count reports none.
func (s *familyShare) noLocalEndpoints(fp *familyProxier, internal, external int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fp.noLocal = [2]int{internal, external}
	var most [2]int
	for _, m := range s.members {
		most[0], most[1] = max(most[0], m.noLocal[0]), max(most[1], m.noLocal[1])
	}
	family := string(s.family)
	s.metrics.noLocalEndpoints.WithLabelValues(family, "internal").Set(float64(most[0]))
	s.metrics.noLocalEndpoints.WithLabelValues(family, "external").Set(float64(most[1]))
}

// pending returns the largest count that pending gives for one of the
// family's groups: each group tracks every change of the family, so that
// the family's changes not yet synced are those of the group furthest
// behind.
func (s *familyShare) pending(pending func(*familyProxier) int) int {
	s.mu.Lock()
	members := s.members
	s.mu.Unlock()
	n := 0
	for _, m := range members {
		n = max(n, pending(m))
	}
	return n
}

// sliceChanged delivers a slice's event to the endpoints tracker of every
// group of the family, and asks those it changed for a sync.
func (s *familyShare) sliceChanged(slice *discoveryv1.EndpointSlice, deleted bool) {
	s.events.Lock()
	defer s.events.Unlock()
	s.delivered++
	for _, fp := range s.members {
		if fp.epTracker.EndpointSliceUpdate(slice, deleted) {
			fp.queued()
		}
	}
}

// serviceChanged delivers a Service's event to the service tracker of
// every group of the family, and asks those it changed for a sync.
func (s *familyShare) serviceChanged(previous, current *v1.Service) {
	s.events.Lock()
	defer s.events.Unlock()
	s.delivered++
	for _, fp := range s.members {
		if fp.svcTracker.Update(previous, current) {
			fp.queued()
		}
	}
}

// takeChanges runs take, which takes fp's trackers' changes, between two
// events, and records in fp how many events it holds.
func (s *familyShare) takeChanges(fp *familyProxier, take func()) {
	s.events.RLock()
	defer s.events.RUnlock()
	take()
	fp.takenSeq = s.delivered
}

// applied records a good sync of fp, which applied the events its input
// held and the change trigger times in triggers, and observes the network
// programming latency of each change once for the family: from its
// trigger time to when the last of the family's groups has applied it.
// With one group that is now. With several, each takes the same changes
// and the first group's trigger times stand for them all; a time waits
// until every group has had a good sync holding the events that the first
// group's did, and is lost, as with one group, when the first group's sync
// of it fails. Those waiting grow with the changes while a group keeps
// failing, as the changes its trackers hold do.
func (s *familyShare) applied(fp *familyProxier, triggers map[types.NamespacedName][]time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fp.appliedSeq = fp.takenSeq
	done := time.Now()
	if len(s.members) == 1 {
		for _, times := range triggers {
			for _, t := range times {
				s.metrics.networkProgramming.WithLabelValues(string(s.family)).Observe(done.Sub(t).Seconds())
			}
		}
		return
	}
	if fp == s.members[0] {
		for _, times := range triggers {
			for _, t := range times {
				s.triggers = append(s.triggers, pendingTrigger{at: t, seq: fp.takenSeq})
			}
		}
	}
	if len(s.triggers) == 0 {
		return
	}
	least := fp.appliedSeq
	for _, m := range s.members {
		least = min(least, m.appliedSeq)
	}
	// In the order taken, so by seq: the ones applied everywhere lead.
	n := 0
	for n < len(s.triggers) && s.triggers[n].seq <= least {
		s.metrics.networkProgramming.WithLabelValues(string(s.family)).Observe(done.Sub(s.triggers[n].at).Seconds())
		n++
	}
	if n == len(s.triggers) {
		s.triggers = s.triggers[:0]
	} else {
		s.triggers = s.triggers[n:]
	}
}
