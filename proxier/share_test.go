package proxier

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/healthz"
)

// TestFamilyShareHealth checks the proxy health of a family served by two
// groups: a group that stops syncing makes it unhealthy although the
// other syncs, and two groups that take turns syncing a steady stream of
// changes keep it healthy although one of them always has a change
// pending. Steps: "queue a" (a change reaches group a), "sync a" (a good
// sync of it), "wait 20s" (the clock moves on); after each step the
// family's health is compared.
func TestFamilyShareHealth(t *testing.T) {
	for _, tc := range []struct {
		name   string
		groups []string
		steps  []string
		want   []bool
	}{{
		name:   "one group keeps failing",
		groups: []string{"a", "b"},
		steps:  []string{"queue a", "queue b", "wait 20s", "sync a", "wait 40s", "queue a", "sync a", "wait 40s", "sync b"},
		want:   []bool{true, true, true, true, true, true, true, false, true},
	}, {
		name:   "both take turns under churn",
		groups: []string{"a", "b"},
		steps: []string{"queue a", "queue b", "wait 20s", "sync a", "wait 5s", "queue a", "wait 15s", "sync b",
			"wait 5s", "queue b", "wait 15s", "sync a", "wait 5s", "queue a", "wait 15s", "sync b",
			"wait 5s", "queue b", "wait 15s", "sync a", "wait 5s", "queue a", "wait 15s", "sync b"},
		want: []bool{true, true, true, true, true, true, true, true,
			true, true, true, true, true, true, true, true,
			true, true, true, true, true, true, true, true},
	}, {
		name:   "one group",
		groups: []string{"a"},
		steps:  []string{"queue a", "wait 40s", "sync a", "queue a", "wait 40s", "wait 40s", "sync a"},
		want:   []bool{true, true, true, true, true, false, true},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			clock := clocktesting.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			hs := healthz.NewProxyHealthServer("", time.Minute, healthz.WithClock(clock))
			m, err := newMetrics(nil, func() int { return 0 }, func() int { return 0 })
			if err != nil {
				t.Fatal(err)
			}
			share := newFamilyShare(v1.IPv4Protocol, hs, m)
			groups := map[string]*familyProxier{}
			for _, name := range tc.groups {
				groups[name] = newFamilyProxier(context.Background(), v1.IPv4Protocol, "node-a", changetracker.NewNodeTopology("node-a"), m)
				share.join(groups[name])
			}
			var got []bool
			for _, step := range tc.steps {
				var op, arg string
				if _, err := fmt.Sscan(step, &op, &arg); err != nil {
					t.Fatalf("step %q: %v", step, err)
				}
				switch op {
				case "queue":
					share.queued(groups[arg])
				case "sync":
					share.updated(groups[arg])
				case "wait":
					d, err := time.ParseDuration(arg)
					if err != nil {
						t.Fatal(err)
					}
					// The groups' own clock is the real one; only the
					// order of their changes matters to the share.
					time.Sleep(time.Millisecond)
					clock.SetTime(clock.Now().Add(d))
				}
				got = append(got, hs.Health().Healthy)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("health after each of %q (-want +got):\n%s", tc.steps, diff)
			}
		})
	}
}
