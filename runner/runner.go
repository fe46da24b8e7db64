package runner

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Runner calls a function at a bounded frequency. Create one with [New],
// start it with [Runner.Loop] and ask for runs with [Runner.Run]. A Runner
// is safe for concurrent use.
type Runner struct {
	name          string
	fn            func() error
	minInterval   time.Duration
	retryInterval time.Duration
	maxInterval   time.Duration
	clock         clock.WithTicker
	observers     []func(RunInfo)

	// requests holds at most one pending request. A full buffer means a run
	// is already owed, so further requests coalesce into it. Because it is
	// buffered, a Run before Loop starts is kept rather than dropped
	// (kubernetes/kubernetes#131615).
	requests chan struct{}

	// looping is set while a Loop is running. A second, concurrent Loop
	// would break the promise that fn never runs concurrently with itself.
	looping atomic.Bool

	// waiting, when a test sets it, is called each time Loop is about to
	// block on a timer, with the timer's duration. The timer already exists
	// when it is called, so a test may step a fake clock right after.
	waiting func(time.Duration)
}

// RunInfo describes one finished call of the function, for an observer set
// with [WithObserver].
type RunInfo struct {
	// Start is when the call began, on the runner's clock.
	Start time.Time
	// Duration is how long the call took, on the runner's clock.
	Duration time.Duration
	// Err is what the call returned; nil means it succeeded.
	Err error
}

// Option configures a [Runner]; pass options to [New].
type Option func(*Runner)

// WithClock makes the runner read time and wait on c instead of the real
// clock, so that tests can drive it with a fake clock
// (k8s.io/utils/clock/testing). A nil c makes [New] panic.
func WithClock(c clock.WithTicker) Option {
	return func(r *Runner) { r.clock = c }
}

// WithObserver makes the runner call observe after every call of its
// function, with when the call started, how long it took and what it
// returned; a proxier uses it to export sync duration and last-sync metrics
// without this package importing a metrics library. observe runs on the
// Loop goroutine before the runner decides when to run next, so it must
// return quickly and must not call [Runner.Loop]; calling [Runner.Run] from
// it is fine. Each WithObserver adds one observer; they are called in the
// order given. A nil observe is ignored.
func WithObserver(observe func(RunInfo)) Option {
	return func(r *Runner) {
		if observe != nil {
			r.observers = append(r.observers, observe)
		}
	}
}

// New returns a Runner that calls fn at a bounded frequency; name
// identifies it in logs and panics. Nothing runs until [Runner.Loop] is
// called. Once Loop runs, the runner guarantees:
//
//   - fn never runs concurrently with itself: it runs only on the goroutine
//     of the one Loop allowed at a time;
//   - the first run starts as soon as Loop starts;
//   - a run starts no sooner than minInterval after the previous run ended,
//     even if it was requested while the previous one was still running
//     (kubernetes/kubernetes#138073 describes the surprise when it is not);
//   - a Run call is honoured by the first run that starts after it, as soon
//     as minInterval allows; any number of Run calls before that run starts
//     coalesce into it, and a Run call before Loop starts is not lost;
//   - after a run that returned an error, the next run starts at the latest
//     retryInterval after it ended, or minInterval if that is longer; a
//     later successful run restores the normal schedule;
//   - with no requests and no errors, fn runs every maxInterval, counted
//     from the end of the previous run;
//   - once Loop's context is done, no new run starts; a run in progress
//     finishes first, and Loop returns after it.
//
// minInterval and retryInterval may be zero (run as soon as asked, retry as
// soon as minInterval allows); maxInterval must be positive. New panics,
// with a message naming the runner and the offending values, if an interval
// is negative, maxInterval is zero, minInterval or retryInterval is greater
// than maxInterval, fn is nil, or a [WithClock] option passes a nil clock.
// These are programming errors, not runtime conditions, which is why New
// panics rather than returning an error.
func New(name string, fn func() error, minInterval, retryInterval, maxInterval time.Duration, opts ...Option) *Runner {
	return newRunner(name, fn, minInterval, retryInterval, maxInterval, clock.RealClock{}, opts...)
}

// newRunner is [New] with the clock as a parameter, so that tests drive time
// by hand; a [WithClock] option still overrides clk. It gives every
// guarantee listed on New, measured on clk:
//
//   - fn never runs concurrently with itself;
//   - the first run starts as soon as Loop starts;
//   - a run starts no sooner than minInterval after the previous one ended;
//   - Run calls are honoured as soon as that allows, coalesce until the run
//     starts, and are kept when made before Loop starts;
//   - after an error the next run starts within max(retryInterval,
//     minInterval); after a success, within maxInterval;
//   - no run starts after Loop's context is done.
//
// It panics on invalid arguments exactly as New does.
func newRunner(name string, fn func() error, minInterval, retryInterval, maxInterval time.Duration, clk clock.WithTicker, opts ...Option) *Runner {
	r := &Runner{
		name:          name,
		fn:            fn,
		minInterval:   minInterval,
		retryInterval: retryInterval,
		maxInterval:   maxInterval,
		clock:         clk,
		requests:      make(chan struct{}, 1),
	}
	for _, opt := range opts {
		opt(r)
	}
	if msg := r.invalid(); msg != "" {
		panic(fmt.Sprintf("runner %q: %s", name, msg))
	}
	return r
}

// invalid describes the first problem with r's configuration, or returns ""
// when there is none.
func (r *Runner) invalid() string {
	switch {
	case r.fn == nil:
		return "fn is nil"
	case r.clock == nil:
		return "clock is nil"
	case r.minInterval < 0:
		return fmt.Sprintf("minInterval %v is negative", r.minInterval)
	case r.retryInterval < 0:
		return fmt.Sprintf("retryInterval %v is negative", r.retryInterval)
	case r.maxInterval <= 0:
		return fmt.Sprintf("maxInterval %v is not positive", r.maxInterval)
	case r.minInterval > r.maxInterval:
		return fmt.Sprintf("minInterval %v is greater than maxInterval %v", r.minInterval, r.maxInterval)
	case r.retryInterval > r.maxInterval:
		return fmt.Sprintf("retryInterval %v is greater than maxInterval %v", r.retryInterval, r.maxInterval)
	}
	return ""
}

// Run asks for a run of the function as soon as minInterval allows. It
// never blocks and never runs the function itself. Calls made before the
// next run starts coalesce into that one run; a call made while the function
// is running asks for another run after it. A call before [Runner.Loop]
// starts is served by Loop's first run; a call after Loop has returned is
// kept for the next Loop, if any.
func (r *Runner) Run() {
	select {
	case r.requests <- struct{}{}:
	default: // a run is already owed; this request is part of it
	}
}

// Loop runs the function as described on [New] until ctx is done, then
// returns. It runs the function at once when it starts, on the calling
// goroutine, so callers usually start it with `go r.Loop(ctx)`. If ctx is
// already done, Loop returns without running anything. When ctx is done
// during a run, that run finishes and Loop returns without starting another.
//
// Errors from the function are logged and retried, never returned. A panic
// in the function is not recovered. Only one Loop runs at a time: a call
// made while another Loop of the same Runner is running logs an error and
// returns at once. Loop may be called again after it has returned. It logs
// through klog.FromContext(ctx).
func (r *Runner) Loop(ctx context.Context) {
	logger := klog.FromContext(ctx).WithValues("runner", r.name)
	if !r.looping.CompareAndSwap(false, true) {
		logger.Error(nil, "Loop is already running for this runner, ignoring this call")
		return
	}
	defer r.looping.Store(false)

	logger.V(2).Info("Starting runner", "minInterval", r.minInterval, "retryInterval", r.retryInterval, "maxInterval", r.maxInterval)
	defer logger.V(2).Info("Runner stopped")

	for ctx.Err() == nil {
		end, failed := r.runOnce(logger)
		if !r.waitForNext(ctx, end, failed) {
			return
		}
	}
}

// runOnce calls fn once and reports when it ended and whether it failed.
func (r *Runner) runOnce(logger klog.Logger) (end time.Time, failed bool) {
	// Requests made before fn starts are served by this run. One made while
	// fn runs may come after fn read the state it was about, so it stays
	// queued and causes another run.
	select {
	case <-r.requests:
	default:
	}

	start := r.clock.Now()
	logger.V(4).Info("Running")
	err := r.fn()
	end = r.clock.Now()
	elapsed := end.Sub(start)
	if err != nil {
		logger.Error(err, "Run failed, will retry", "elapsed", elapsed, "retryAfter", r.retryDelay())
	} else {
		logger.V(4).Info("Run succeeded", "elapsed", elapsed)
	}
	for _, observe := range r.observers {
		observe(RunInfo{Start: start, Duration: elapsed, Err: err})
	}
	return end, err != nil
}

// retryDelay is how long after a failed run ends the next one starts when
// nothing asks for it sooner.
func (r *Runner) retryDelay() time.Duration {
	return max(r.retryInterval, r.minInterval)
}

// waitForNext blocks until the next run is due, counting from lastEnd. It
// returns false if ctx is done first.
func (r *Runner) waitForNext(ctx context.Context, lastEnd time.Time, failed bool) bool {
	idle := r.maxInterval
	if failed {
		idle = r.retryDelay()
	}
	requested := false
	for {
		if ctx.Err() != nil {
			return false
		}
		if !requested {
			select {
			case <-r.requests:
				requested = true
			default:
			}
		}
		due := idle
		if requested {
			due = r.minInterval
		}
		wait := due - r.clock.Since(lastEnd)
		if wait <= 0 {
			return true
		}

		timer := r.clock.NewTimer(wait)
		if r.waiting != nil {
			r.waiting(wait)
		}
		// Once a request is pending, further ones change nothing, so stop
		// listening for them (a nil channel never delivers).
		var requests <-chan struct{}
		if !requested {
			requests = r.requests
		}
		select {
		case <-ctx.Done():
			timer.Stop()
			return false
		case <-requests:
			timer.Stop()
			requested = true
		case <-timer.C():
		}
	}
}
