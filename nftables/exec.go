package nftables

import (
	"context"
	"errors"
	"fmt"
	"time"

	"sigs.k8s.io/knftables"
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
// Each call runs on the calling goroutine, so nft runs in the network
// namespace of the calling thread, as without the bound. knftables
// returns once nft has exited and closed its output; nft starts no child
// that could keep it open, but a process stuck in the kernel exits only
// when the kernel lets it, and the call waits until then.
//
// A timeout of zero or less returns nft itself, as does a nil nft.
// NewTransaction is nft's.
func BoundedInterface(nft knftables.Interface, timeout time.Duration) knftables.Interface {
	if nft == nil || timeout <= 0 {
		return nft
	}
	return &boundedInterface{Interface: nft, timeout: timeout}
}

// boundedInterface is BoundedInterface's Interface.
type boundedInterface struct {
	knftables.Interface
	timeout time.Duration
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

// bounded runs call, on this goroutine (whose thread's network namespace
// nft runs in), with ctx bounded by b's timeout, and returns what it
// returns, its error naming the timeout when that ended it.
func bounded[T any](ctx context.Context, b *boundedInterface, call func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, b.timeout, &commandTimeout{after: b.timeout, what: "killed"})
	defer cancel()
	v, err := call(ctx)
	return v, timeoutCause(ctx, err)
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
