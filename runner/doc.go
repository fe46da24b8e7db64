// Package runner calls one function, typically a proxier's sync, at a
// bounded frequency: no more often than a minimum interval, at least once
// per maximum interval, sooner after a failure, and as soon as allowed after
// someone asks for it.
//
// A proxier's event handlers call [Runner.Run] whenever a Service,
// EndpointSlice or Node changes. Bursts of events then cost one sync instead
// of hundreds, a quiet cluster is still resynced every maxInterval (which
// repairs rules someone else deleted), and a failed sync is retried after
// retryInterval instead of waiting for the next event.
//
// It is not a work queue: it does not remember what changed, how many times
// it was asked, or by whom, and it never passes arguments to the function.
// The function must find its pending work itself (for example in a
// changetracker). It is not a rate limiter for many independent callers
// either: there is exactly one function and one [Runner.Loop].
//
// The smallest use:
//
//	r := runner.New("sync-proxy-rules", proxier.syncProxyRules,
//		time.Second, 5*time.Second, time.Hour)
//	go r.Loop(ctx) // runs syncProxyRules at once, then as requested
//	...
//	r.Run() // from an event handler; never blocks
package runner
