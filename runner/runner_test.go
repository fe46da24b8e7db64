package runner

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// testTimeout bounds the wait for an event that a correct runner produces
// at once. It only matters when the runner is broken: it turns a hang into
// a failure with a diff.
const testTimeout = 30 * time.Second

var errSync = errors.New("sync failed")

// result scripts one call of the harness's function.
type result struct {
	err     error         // what the call returns
	takes   time.Duration // how far the call moves the fake clock
	request bool          // the call asks its own runner for another run
	cancel  bool          // the call cancels Loop's context
}

// harness drives a Runner on a fake clock and records what it does as
// events, "<time since start> <what>", in the order they happen:
// "0s run 1" when the function starts, "0s wait 10s" when Loop blocks on a
// timer (the timer exists by then, so the test may step the clock), and
// "0s loop returned" when Loop returns. After a "wait" or "loop returned"
// event the runner can do nothing until the test acts, which is what lets
// the tests say that nothing else happened without sleeping.
type harness struct {
	t       *testing.T
	clock   *clocktesting.FakeClock
	start   time.Time
	runner  *Runner
	logger  klog.Logger
	ctx     context.Context
	cancel  context.CancelFunc
	results map[int]result // by run number, from 1; a missing one succeeds at once
	runs    int            // touched only by the function, on the Loop goroutine
	events  chan string

	loops    int // Loops started
	returned int // Loops seen returning
}

func newHarness(t *testing.T, minInterval, retryInterval, maxInterval time.Duration, results map[int]result, opts ...Option) *harness {
	t.Helper()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := &harness{
		t:       t,
		clock:   clocktesting.NewFakeClock(start),
		start:   start,
		logger:  ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true))),
		results: results,
		events:  make(chan string, 100),
	}
	h.renew()
	h.runner = newRunner("test", h.fn, minInterval, retryInterval, maxInterval, h.clock, opts...)
	h.runner.waiting = func(d time.Duration) { h.emit("wait %v", d) }
	t.Cleanup(h.stop)
	return h
}

// renew gives the next Loop a fresh context.
func (h *harness) renew() {
	h.ctx, h.cancel = context.WithCancel(klog.NewContext(context.Background(), h.logger))
}

func (h *harness) emit(format string, args ...any) {
	h.events <- h.clock.Since(h.start).String() + " " + fmt.Sprintf(format, args...)
}

func (h *harness) fn() error {
	h.runs++
	res := h.results[h.runs]
	h.emit("run %d", h.runs)
	h.clock.Step(res.takes)
	if res.request {
		h.runner.Run()
	}
	if res.cancel {
		h.cancel()
	}
	return res.err
}

func (h *harness) startLoop() {
	h.loops++
	ctx := h.ctx
	go func() {
		h.runner.Loop(ctx)
		h.emit("loop returned")
	}()
}

// next returns the next event, failing the test after testTimeout.
func (h *harness) next(what string) (string, bool) {
	select {
	case e := <-h.events:
		if strings.HasSuffix(e, " loop returned") {
			h.returned++
		}
		return e, true
	case <-time.After(testTimeout):
		h.t.Errorf("%s: no event after %v", what, testTimeout)
		return "", false
	}
}

// expect checks that exactly want happens next. The last event of want must
// leave the runner idle (a wait or a return), or the check for extra
// events would race with the runner.
func (h *harness) expect(what string, want []string) {
	h.t.Helper()
	var got []string
	for range want {
		e, ok := h.next(what)
		if !ok {
			break
		}
		got = append(got, e)
	}
	select {
	case e := <-h.events:
		got = append(got, e)
	default:
	}
	if diff := cmp.Diff(want, got); diff != "" {
		h.t.Fatalf("%s: events (-want +got):\n%s", what, diff)
	}
}

// stop ends every Loop the test started, so none logs after the test.
func (h *harness) stop() {
	h.cancel()
	for h.returned < h.loops {
		if _, ok := h.next("cleanup"); !ok {
			return
		}
	}
}

// action is one thing a test does to the runner or its clock.
type action struct {
	name string
	do   func(h *harness)
}

func startLoop() action { return action{"start Loop", (*harness).startLoop} }
func cancelLoop() action {
	return action{"cancel Loop's context", func(h *harness) { h.cancel() }}
}
func renewContext() action { return action{"new context", (*harness).renew} }

func request(n int) action {
	return action{fmt.Sprintf("Run x%d", n), func(h *harness) {
		for range n {
			h.runner.Run()
		}
	}}
}

func advance(d time.Duration) action {
	return action{fmt.Sprintf("advance %v", d), func(h *harness) { h.clock.Step(d) }}
}

type step struct {
	do   action
	want []string // events that follow, in order; nothing else may happen
}

func TestSchedule(t *testing.T) {
	const (
		ms  = time.Millisecond
		sec = time.Second
	)
	tests := []struct {
		name                                    string
		minInterval, retryInterval, maxInterval time.Duration
		results                                 map[int]result
		steps                                   []step
	}{
		{
			name:        "first run at once, then every maxInterval counted from the end",
			minInterval: sec, retryInterval: 5 * sec, maxInterval: 10 * sec,
			results: map[int]result{2: {takes: 2 * sec}},
			steps: []step{
				{startLoop(), []string{"0s run 1", "0s wait 10s"}},
				{advance(10*sec - ms), nil},
				{advance(ms), []string{"10s run 2", "12s wait 10s"}},
				{advance(10*sec - ms), nil},
				{advance(ms), []string{"22s run 3", "22s wait 10s"}},
			},
		},
		{
			name:        "requests before Loop starts are served by the first run",
			minInterval: sec, retryInterval: 5 * sec, maxInterval: 10 * sec,
			steps: []step{
				{request(3), nil},
				{startLoop(), []string{"0s run 1", "0s wait 10s"}},
				{advance(10 * sec), []string{"10s run 2", "10s wait 10s"}},
			},
		},
		{
			name:        "request after minInterval runs at once",
			minInterval: sec, retryInterval: 5 * sec, maxInterval: 10 * sec,
			steps: []step{
				{startLoop(), []string{"0s run 1", "0s wait 10s"}},
				{advance(2 * sec), nil},
				{request(1), []string{"2s run 2", "2s wait 10s"}},
				{request(1), []string{"2s wait 1s"}},
			},
		},
		{
			name:        "requests within minInterval coalesce into one run at minInterval",
			minInterval: sec, retryInterval: 5 * sec, maxInterval: 10 * sec,
			steps: []step{
				{startLoop(), []string{"0s run 1", "0s wait 10s"}},
				{advance(300 * ms), nil},
				{request(1), []string{"300ms wait 700ms"}},
				{advance(200 * ms), nil},
				{request(5), nil},
				{advance(500*ms - 1), nil},
				{advance(1), []string{"1s run 2", "1s wait 10s"}},
				{advance(10 * sec), []string{"11s run 3", "11s wait 10s"}},
			},
		},
		{
			name:        "request during a run causes one more run, minInterval after it ends",
			minInterval: sec, retryInterval: 5 * sec, maxInterval: 10 * sec,
			results: map[int]result{1: {takes: 3 * sec, request: true}},
			steps: []step{
				{startLoop(), []string{"0s run 1", "3s wait 1s"}},
				{advance(sec - ms), nil},
				{advance(ms), []string{"4s run 2", "4s wait 10s"}},
			},
		},
		{
			name:        "a failed run is retried after retryInterval and success restores maxInterval",
			minInterval: sec, retryInterval: 5 * sec, maxInterval: 10 * sec,
			results: map[int]result{1: {err: errSync}, 2: {err: errSync, takes: sec}},
			steps: []step{
				{startLoop(), []string{"0s run 1", "0s wait 5s"}},
				{advance(5*sec - ms), nil},
				{advance(ms), []string{"5s run 2", "6s wait 5s"}},
				{advance(5 * sec), []string{"11s run 3", "11s wait 10s"}},
			},
		},
		{
			name:        "a request after a failure runs at minInterval, not retryInterval",
			minInterval: sec, retryInterval: 5 * sec, maxInterval: 10 * sec,
			results: map[int]result{1: {err: errSync}},
			steps: []step{
				{startLoop(), []string{"0s run 1", "0s wait 5s"}},
				{request(1), []string{"0s wait 1s"}},
				{advance(sec), []string{"1s run 2", "1s wait 10s"}},
			},
		},
		{
			name:        "retryInterval shorter than minInterval waits for minInterval",
			minInterval: 2 * sec, retryInterval: sec, maxInterval: 10 * sec,
			results: map[int]result{1: {err: errSync}},
			steps: []step{
				{startLoop(), []string{"0s run 1", "0s wait 2s"}},
				{advance(2 * sec), []string{"2s run 2", "2s wait 10s"}},
			},
		},
		{
			name:        "retryInterval equal to maxInterval",
			minInterval: sec, retryInterval: 10 * sec, maxInterval: 10 * sec,
			results: map[int]result{1: {err: errSync}},
			steps: []step{
				{startLoop(), []string{"0s run 1", "0s wait 10s"}},
				{advance(10 * sec), []string{"10s run 2", "10s wait 10s"}},
			},
		},
		{
			name:        "minInterval zero runs each request at once",
			minInterval: 0, retryInterval: 0, maxInterval: 10 * sec,
			results: map[int]result{3: {request: true}},
			steps: []step{
				{startLoop(), []string{"0s run 1", "0s wait 10s"}},
				{request(1), []string{"0s run 2", "0s wait 10s"}},
				{request(1), []string{"0s run 3", "0s run 4", "0s wait 10s"}},
			},
		},
		{
			name:        "cancel while waiting returns without a run, and Run after that does not block",
			minInterval: sec, retryInterval: 5 * sec, maxInterval: 10 * sec,
			steps: []step{
				{startLoop(), []string{"0s run 1", "0s wait 10s"}},
				{request(1), []string{"0s wait 1s"}},
				{cancelLoop(), []string{"0s loop returned"}},
				{advance(10 * sec), nil},
				{request(3), nil},
			},
		},
		{
			name:        "cancel during a run lets it finish and starts no other, even if requested",
			minInterval: 0, retryInterval: 0, maxInterval: 10 * sec,
			results: map[int]result{1: {takes: sec, request: true, cancel: true, err: errSync}},
			steps: []step{
				{startLoop(), []string{"0s run 1", "1s loop returned"}},
			},
		},
		{
			name:        "cancel during a run with a request pending does not wait out minInterval",
			minInterval: sec, retryInterval: 5 * sec, maxInterval: 10 * sec,
			results: map[int]result{1: {request: true, cancel: true}},
			steps: []step{
				{startLoop(), []string{"0s run 1", "0s loop returned"}},
			},
		},
		{
			name:        "Loop with a done context runs nothing",
			minInterval: sec, retryInterval: 5 * sec, maxInterval: 10 * sec,
			steps: []step{
				{cancelLoop(), nil},
				{startLoop(), []string{"0s loop returned"}},
			},
		},
		{
			name:        "Loop runs again at once after a restart",
			minInterval: sec, retryInterval: 5 * sec, maxInterval: 10 * sec,
			steps: []step{
				{startLoop(), []string{"0s run 1", "0s wait 10s"}},
				{cancelLoop(), []string{"0s loop returned"}},
				{renewContext(), nil},
				{startLoop(), []string{"0s run 2", "0s wait 10s"}},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.minInterval, tc.retryInterval, tc.maxInterval, tc.results)
			for i, s := range tc.steps {
				s.do.do(h)
				h.expect(fmt.Sprintf("step %d (%s)", i, s.do.name), s.want)
			}
		})
	}
}

func TestSecondLoopReturnsAtOnce(t *testing.T) {
	h := newHarness(t, time.Second, 5*time.Second, 10*time.Second, nil)
	h.startLoop()
	h.expect("first Loop", []string{"0s run 1", "0s wait 10s"})

	go func() {
		h.runner.Loop(h.ctx)
		h.emit("second loop returned")
	}()
	h.expect("second Loop", []string{"0s second loop returned"})

	// The first Loop is unaffected.
	h.clock.Step(10 * time.Second)
	h.expect("first Loop after the second", []string{"10s run 2", "10s wait 10s"})

	var gotErrors []string
	for _, entry := range h.logger.GetSink().(ktesting.Underlier).GetBuffer().Data() {
		if entry.Type == ktesting.LogError {
			gotErrors = append(gotErrors, entry.Message)
		}
	}
	want := []string{"Loop is already running for this runner, ignoring this call"}
	if diff := cmp.Diff(want, gotErrors); diff != "" {
		t.Errorf("logged errors (-want +got):\n%s", diff)
	}
}

// TestNoConcurrentRuns hammers Run from several goroutines while two Loops
// compete for the runner, and checks that the function never overlaps with
// itself.
func TestNoConcurrentRuns(t *testing.T) {
	var inflight, overlaps, runs atomic.Int32
	firstRun := make(chan struct{})
	fn := func() error {
		if inflight.Add(1) != 1 {
			overlaps.Add(1)
		}
		runtime.Gosched() // give an overlapping call the chance to show up
		if runs.Add(1) == 1 {
			close(firstRun)
		}
		inflight.Add(-1)
		return nil
	}
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	r := newRunner("test", fn, 0, 0, time.Hour, clocktesting.NewFakeClock(time.Now()))

	var loops, callers sync.WaitGroup
	for range 2 {
		loops.Go(func() { r.Loop(ctx) })
	}
	// Cancelling before any Loop got going would make the test vacuous.
	<-firstRun
	for range 4 {
		callers.Go(func() {
			for range 1000 {
				r.Run()
			}
		})
	}
	callers.Wait()
	cancel()
	loops.Wait()

	if n := overlaps.Load(); n != 0 {
		t.Errorf("the function overlapped with itself %d times", n)
	}
}

func TestObserver(t *testing.T) {
	var infos []RunInfo // appended on the Loop goroutine, read after it returned
	var order []string
	h := newHarness(t, time.Second, 5*time.Second, 10*time.Second,
		map[int]result{1: {err: errSync, takes: 3 * time.Second}, 2: {takes: 500 * time.Millisecond}},
		WithObserver(func(info RunInfo) {
			infos = append(infos, info)
			order = append(order, "first")
		}),
		WithObserver(nil),
		WithObserver(func(RunInfo) { order = append(order, "second") }),
	)
	h.startLoop()
	h.expect("first run", []string{"0s run 1", "3s wait 5s"})
	h.clock.Step(5 * time.Second)
	h.expect("second run", []string{"8s run 2", "8.5s wait 10s"})
	h.cancel()
	h.expect("cancel", []string{"8.5s loop returned"})

	wantInfos := []RunInfo{
		{Start: h.start, Duration: 3 * time.Second, Err: errSync},
		{Start: h.start.Add(8 * time.Second), Duration: 500 * time.Millisecond},
	}
	if diff := cmp.Diff(wantInfos, infos, cmpopts.EquateErrors()); diff != "" {
		t.Errorf("observed runs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"first", "second", "first", "second"}, order); diff != "" {
		t.Errorf("observer order (-want +got):\n%s", diff)
	}
}

func TestLogs(t *testing.T) {
	h := newHarness(t, time.Second, 5*time.Second, 10*time.Second,
		map[int]result{1: {err: errSync}})
	h.startLoop()
	h.expect("first run", []string{"0s run 1", "0s wait 5s"})
	h.clock.Step(5 * time.Second)
	h.expect("retry", []string{"5s run 2", "5s wait 10s"})
	h.cancel()
	h.expect("cancel", []string{"5s loop returned"})

	var got []string
	for _, e := range h.logger.GetSink().(ktesting.Underlier).GetBuffer().Data() {
		got = append(got, fmt.Sprintf("%s V(%d) %q err=%v %v", e.Type, e.Verbosity, e.Message, e.Err, e.WithKVList))
	}
	want := []string{
		`INFO V(2) "Starting runner" err=<nil> [runner test]`,
		`INFO V(4) "Running" err=<nil> [runner test]`,
		`ERROR V(0) "Run failed, will retry" err=sync failed [runner test]`,
		`INFO V(4) "Running" err=<nil> [runner test]`,
		`INFO V(4) "Run succeeded" err=<nil> [runner test]`,
		`INFO V(2) "Runner stopped" err=<nil> [runner test]`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("log entries (-want +got):\n%s", diff)
	}
}

func TestNewPanics(t *testing.T) {
	fn := func() error { return nil }
	tests := []struct {
		name                                    string
		fn                                      func() error
		minInterval, retryInterval, maxInterval time.Duration
		opts                                    []Option
		want                                    string // "" means New must not panic
	}{
		{
			name: "valid", fn: fn,
			minInterval: time.Second, retryInterval: 5 * time.Second, maxInterval: time.Minute,
		},
		{
			name: "zero minInterval and retryInterval are valid", fn: fn,
			maxInterval: time.Nanosecond,
		},
		{
			name: "all intervals equal are valid", fn: fn,
			minInterval: time.Second, retryInterval: time.Second, maxInterval: time.Second,
		},
		{
			name: "negative minInterval", fn: fn,
			minInterval: -time.Second, retryInterval: time.Second, maxInterval: time.Minute,
			want: `runner "sync": minInterval -1s is negative`,
		},
		{
			name: "negative retryInterval", fn: fn,
			minInterval: time.Second, retryInterval: -time.Second, maxInterval: time.Minute,
			want: `runner "sync": retryInterval -1s is negative`,
		},
		{
			name: "negative maxInterval", fn: fn,
			maxInterval: -time.Minute,
			want:        `runner "sync": maxInterval -1m0s is not positive`,
		},
		{
			name: "zero maxInterval", fn: fn,
			want: `runner "sync": maxInterval 0s is not positive`,
		},
		{
			name: "minInterval greater than maxInterval", fn: fn,
			minInterval: 2 * time.Minute, retryInterval: time.Second, maxInterval: time.Minute,
			want: `runner "sync": minInterval 2m0s is greater than maxInterval 1m0s`,
		},
		{
			name: "retryInterval greater than maxInterval", fn: fn,
			minInterval: time.Second, retryInterval: 2 * time.Minute, maxInterval: time.Minute,
			want: `runner "sync": retryInterval 2m0s is greater than maxInterval 1m0s`,
		},
		{
			name:        "nil fn",
			minInterval: time.Second, retryInterval: time.Second, maxInterval: time.Minute,
			want: `runner "sync": fn is nil`,
		},
		{
			name: "nil clock", fn: fn,
			minInterval: time.Second, retryInterval: time.Second, maxInterval: time.Minute,
			opts: []Option{WithClock(nil)},
			want: `runner "sync": clock is nil`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := func() (msg string) {
				defer func() {
					if p := recover(); p != nil {
						msg = fmt.Sprint(p)
					}
				}()
				New("sync", tc.fn, tc.minInterval, tc.retryInterval, tc.maxInterval, tc.opts...)
				return ""
			}()
			if got != tc.want {
				t.Errorf("panic message: got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestWithClock(t *testing.T) {
	fn := func() error { return nil }
	fake := clocktesting.NewFakeClock(time.Now())
	tests := []struct {
		name string
		opts []Option
		want clock.WithTicker
	}{
		{name: "default is the real clock", want: clock.RealClock{}},
		{name: "WithClock replaces it", opts: []Option{WithClock(fake)}, want: fake},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := New("sync", fn, time.Second, time.Second, time.Minute, tc.opts...)
			if r.clock != tc.want {
				t.Errorf("clock: got %T, want %T", r.clock, tc.want)
			}
		})
	}
}
