package iptables_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
)

const canary = iptables.Chain("PROXYKIT-CANARY")

var monitored = []iptables.Table{iptables.TableMangle, iptables.TableNAT, iptables.TableFilter}

// countingClock is a FakeClock that counts the timers made on it. Monitor
// makes a new timer for every wait, so a higher count after a step shows
// that Monitor finished the work the step caused and waits again; watching
// HasWaiters alone can miss the moment between two waits and hang.
type countingClock struct {
	*clocktesting.FakeClock
	timers atomic.Int64
}

func (c *countingClock) NewTimer(d time.Duration) clock.Timer {
	c.timers.Add(1) // before the timer exists, so HasWaiters implies the count
	return c.FakeClock.NewTimer(d)
}

// monitorHarness runs Monitor against a Fake on a fake clock.
type monitorHarness struct {
	t       *testing.T
	ctx     context.Context
	fake    *iptablestest.Fake
	clock   *countingClock
	reloads atomic.Int32
	done    chan struct{}
}

func startMonitor(t *testing.T) *monitorHarness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := &monitorHarness{t: t, ctx: ctx, clock: &countingClock{FakeClock: clocktesting.NewFakeClock(time.Unix(1e9, 0))}, done: make(chan struct{})}
	h.fake = iptablestest.NewFake(iptablestest.WithClock(h.clock))
	go func() {
		defer close(h.done)
		h.fake.Monitor(ctx, canary, monitored, func() { h.reloads.Add(1) }, time.Minute)
	}()
	t.Cleanup(func() {
		cancel()
		<-h.done
	})
	h.waitForTimer()
	return h
}

// waitForTimer waits until Monitor is blocked on the clock.
func (h *monitorHarness) waitForTimer() {
	for !h.clock.HasWaiters() {
		runtime.Gosched()
	}
}

// step advances the clock by d, which must fire the timer Monitor waits on,
// and waits until Monitor has made its next timer and waits on it.
func (h *monitorHarness) step(d time.Duration) {
	h.waitForTimer()
	before := h.clock.timers.Load()
	h.clock.Step(d)
	for h.clock.timers.Load() == before {
		runtime.Gosched()
	}
	h.waitForTimer()
}

func (h *monitorHarness) canariesIntact() bool {
	for _, table := range monitored {
		ok, err := h.fake.RuleExists(h.ctx, table, canary, "-j", "RETURN")
		if err != nil || !ok {
			return false
		}
	}
	return true
}

func TestMonitor(t *testing.T) {
	for _, tc := range []struct {
		name        string
		disturb     func(h *monitorHarness)
		steps       []time.Duration
		wantReloads int32
	}{
		{
			name:    "nothing happens",
			disturb: func(*monitorHarness) {},
			steps:   []time.Duration{time.Minute, time.Minute},
		},
		{
			name: "canaries deleted everywhere (firewalld reload)",
			disturb: func(h *monitorHarness) {
				for _, table := range monitored {
					if err := h.fake.RestoreAll(h.ctx, []byte("*"+string(table)+"\nCOMMIT\n"), iptables.FlushTables, iptables.NoRestoreCounters); err != nil {
						h.t.Fatal(err)
					}
				}
			},
			steps:       []time.Duration{time.Minute},
			wantReloads: 1,
		},
		{
			name: "one table flushed with iptables -F: waits for the others, then reloads",
			disturb: func(h *monitorHarness) {
				if err := h.fake.RestoreAll(h.ctx, []byte("*nat\n-F\nCOMMIT\n"), iptables.NoFlushTables, iptables.NoRestoreCounters); err != nil {
					h.t.Fatal(err)
				}
			},
			// One minute to notice, then 5s of polling every 100ms.
			steps:       append([]time.Duration{time.Minute}, repeat(100*time.Millisecond, 50)...),
			wantReloads: 1,
		},
		{
			name: "canary chain flushed",
			disturb: func(h *monitorHarness) {
				if err := h.fake.FlushChain(h.ctx, iptables.TableFilter, canary); err != nil {
					h.t.Fatal(err)
				}
			},
			steps:       append([]time.Duration{time.Minute}, repeat(100*time.Millisecond, 50)...),
			wantReloads: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startMonitor(t)
			if !h.canariesIntact() {
				t.Fatalf("Monitor did not create its canaries:\n%s", h.fake.Dump())
			}
			tc.disturb(h)
			for _, d := range tc.steps {
				h.step(d)
			}
			if got := h.reloads.Load(); got != tc.wantReloads {
				t.Errorf("reloadFunc called %d times, want %d", got, tc.wantReloads)
			}
			if !h.canariesIntact() {
				t.Errorf("canaries not recreated:\n%s", h.fake.Dump())
			}
		})
	}
}

// TestMonitorPollsBeforeFlushTimeout checks that, with one canary gone,
// Monitor does not reload before all are gone or 5s have passed.
func TestMonitorPollsBeforeFlushTimeout(t *testing.T) {
	h := startMonitor(t)
	if err := h.fake.FlushChain(h.ctx, iptables.TableNAT, canary); err != nil {
		t.Fatal(err)
	}
	h.step(time.Minute)
	for range 10 {
		h.step(100 * time.Millisecond)
	}
	if got := h.reloads.Load(); got != 0 {
		t.Fatalf("reloaded after 1s of a partial flush")
	}
	// The rest goes: Monitor reloads at its next poll.
	for _, table := range []iptables.Table{iptables.TableMangle, iptables.TableFilter} {
		if err := h.fake.FlushChain(h.ctx, table, canary); err != nil {
			t.Fatal(err)
		}
	}
	h.step(100 * time.Millisecond)
	if got := h.reloads.Load(); got != 1 {
		t.Fatalf("reloadFunc called %d times after all canaries went, want 1", got)
	}
}

func TestMonitorReturnsOnBadArguments(t *testing.T) {
	f := iptablestest.NewFake()
	for _, tc := range []struct {
		tables   []iptables.Table
		interval time.Duration
	}{
		{tables: nil, interval: time.Second},
		{tables: monitored, interval: 0},
	} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			f.Monitor(context.Background(), canary, tc.tables, func() {}, tc.interval)
		}()
		<-done
	}
	if f.Dump() != "" {
		t.Errorf("Monitor with bad arguments changed rules:\n%s", f.Dump())
	}
}

func repeat(d time.Duration, n int) []time.Duration {
	s := make([]time.Duration, n)
	for i := range s {
		s[i] = d
	}
	return s
}
