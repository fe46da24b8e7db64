package proxier

import (
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"

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

	mu      sync.Mutex
	members []*familyProxier
}

func newFamilyShare(family v1.IPFamily, health *healthz.ProxyHealthServer, m *metrics) *familyShare {
	return &familyShare{family: family, health: health, metrics: m}
}

// join makes fp one of the groups serving the family.
func (s *familyShare) join(fp *familyProxier) {
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
