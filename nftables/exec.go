package nftables

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/boundedexec"
)

// DefaultCommandTimeout bounds each nft command of a BoundedInterface and
// each nf_tables netlink request of Netlink unless they are given another
// bound. It is iptables.DefaultCommandTimeout: far above the slowest nft
// command and netlink batch measured at the largest sizes in
// BENCHMARKS.md, so that only a hung one reaches it, which would
// otherwise stop every later sync.
const DefaultCommandTimeout = 15 * time.Minute

// BoundedInterface returns nft with each call that runs nft (Run, Check
// and the List methods) bounded by timeout: when timeout passes, the
// call's context ends, which makes the Interface of knftables.New kill
// nft, and the call returns an error for which IsCommandTimeout is true.
// A transaction killed so may have been committed or not (the kernel
// takes it whole or not at all, but the kill may come after the commit):
// treat it as any failed transaction, as Writer.Applied does, and sync
// everything again. A call that ends before timeout is returned as it
// is, and one that its caller's context ended is no timeout.
//
// knftables waits for nft's output to close before it returns. Should
// the killed nft not exit (stuck in the kernel) or leave a child holding
// its output (a wrapper script), the call returns anyway, with the
// timeout error, boundedexec.DefaultWaitDelay after the kill; until that
// nft has exited, every call fails at once with such an error instead of
// starting another nft (knftables runs one transaction at a time, so a
// Run would wait for it).
//
// A timeout of zero or less returns nft itself, as does a nil nft.
// NewTransaction is nft's.
func BoundedInterface(nft knftables.Interface, timeout time.Duration) knftables.Interface {
	return newBoundedInterface(nft, timeout, boundedexec.DefaultWaitDelay)
}

func newBoundedInterface(nft knftables.Interface, timeout, waitDelay time.Duration) knftables.Interface {
	if nft == nil || timeout <= 0 {
		return nft
	}
	return &boundedInterface{Interface: nft, timeout: timeout, waitDelay: waitDelay}
}

// boundedInterface is BoundedInterface's Interface.
type boundedInterface struct {
	knftables.Interface
	timeout time.Duration
	// waitDelay is how long a call whose context ended is waited for.
	waitDelay time.Duration
	// abandoned counts the calls returned after waitDelay whose nft has
	// not returned yet.
	abandoned atomic.Int32
}

var _ knftables.Interface = (*boundedInterface)(nil)

// Run is part of knftables.Interface.
func (b *boundedInterface) Run(ctx context.Context, tx *knftables.Transaction) error {
	_, err := bounded(ctx, b, func(ctx context.Context) (struct{}, error) { return struct{}{}, b.Interface.Run(ctx, tx) })
	return err
}

// Check is part of knftables.Interface.
func (b *boundedInterface) Check(ctx context.Context, tx *knftables.Transaction) error {
	_, err := bounded(ctx, b, func(ctx context.Context) (struct{}, error) { return struct{}{}, b.Interface.Check(ctx, tx) })
	return err
}

// ListAll is part of knftables.Interface.
func (b *boundedInterface) ListAll(ctx context.Context) (map[string][]string, error) {
	return bounded(ctx, b, b.Interface.ListAll)
}

// List is part of knftables.Interface.
func (b *boundedInterface) List(ctx context.Context, objectType string) ([]string, error) {
	return bounded(ctx, b, func(ctx context.Context) ([]string, error) { return b.Interface.List(ctx, objectType) })
}

// ListRules is part of knftables.Interface.
func (b *boundedInterface) ListRules(ctx context.Context, chain string) ([]*knftables.Rule, error) {
	return bounded(ctx, b, func(ctx context.Context) ([]*knftables.Rule, error) { return b.Interface.ListRules(ctx, chain) })
}

// ListElements is part of knftables.Interface.
func (b *boundedInterface) ListElements(ctx context.Context, objectType, name string) ([]*knftables.Element, error) {
	return bounded(ctx, b, func(ctx context.Context) ([]*knftables.Element, error) {
		return b.Interface.ListElements(ctx, objectType, name)
	})
}

// ListCounters is part of knftables.Interface.
func (b *boundedInterface) ListCounters(ctx context.Context) ([]*knftables.Counter, error) {
	return bounded(ctx, b, b.Interface.ListCounters)
}

// bounded runs call with ctx bounded by b's timeout, and returns what it
// returns, its error naming the timeout when that ended it; or, when call
// has not returned waitDelay after its context ended, returns without it.
func bounded[T any](ctx context.Context, b *boundedInterface, call func(context.Context) (T, error)) (T, error) {
	var zero T
	if b.abandoned.Load() > 0 {
		return zero, &commandTimeout{after: b.timeout, what: "not run: an nft killed earlier has not exited"}
	}
	ctx, cancel := context.WithTimeoutCause(ctx, b.timeout, &commandTimeout{after: b.timeout, what: "killed"})
	defer cancel()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := call(ctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, timeoutCause(ctx, r.err)
	case <-ctx.Done():
	}
	wait := time.NewTimer(b.waitDelay)
	defer wait.Stop()
	select {
	case r := <-done:
		return r.v, timeoutCause(ctx, r.err)
	case <-wait.C:
	}
	b.abandoned.Add(1)
	go func() {
		<-done
		b.abandoned.Add(-1)
	}()
	var t *commandTimeout
	if errors.As(context.Cause(ctx), &t) {
		return zero, fmt.Errorf("%w (nft has not exited %s after the kill)", t, b.waitDelay)
	}
	return zero, fmt.Errorf("nft has not exited %s after its context ended: %w", b.waitDelay, context.Cause(ctx))
}

// timeoutCause returns err, wrapped in the *commandTimeout that ended ctx
// when ctx's timeout ended the call that returned it.
func timeoutCause(ctx context.Context, err error) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	var t *commandTimeout
	if cause := context.Cause(ctx); errors.As(cause, &t) {
		return fmt.Errorf("%w (%w)", t, err)
	}
	return err
}
