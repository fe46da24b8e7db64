package changetracker

import (
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// TrackerOption configures a ServiceChangeTracker or an
// EndpointsChangeTracker. Options that do not apply to a tracker are ignored
// by it.
type TrackerOption func(*trackerOptions)

type trackerOptions struct {
	logger klog.Logger
	clock  clock.PassiveClock
}

func newTrackerOptions(opts []TrackerOption) trackerOptions {
	o := trackerOptions{
		logger: klog.Background(),
		clock:  clock.RealClock{},
	}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}

// WithLogger makes the tracker log through logger (typically
// klog.FromContext(ctx) of the proxier). The default is klog.Background().
func WithLogger(logger klog.Logger) TrackerOption {
	return func(o *trackerOptions) { o.logger = logger }
}

// WithClock sets the clock the EndpointsChangeTracker reads its start time
// from: last-change-trigger times from before the tracker started are not
// reported, since they would measure the proxy's own start-up, not
// network-programming latency. A nil clock is ignored. The default is the real
// clock.
func WithClock(c clock.PassiveClock) TrackerOption {
	return func(o *trackerOptions) {
		if c != nil {
			o.clock = c
		}
	}
}
