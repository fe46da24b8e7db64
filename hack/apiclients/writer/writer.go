// Package writer uses proxykit's iptables rule writer outside proxykit, as
// a proxy with its own sync loop would: it renders with iptables.Writer and
// applies the payload with any iptables.Interface, the real one or the fake.
package writer

import (
	"context"
	"fmt"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/proxy"
)

// Apply renders in with w and applies it through ipt: on a full sync it
// first makes the built-in chains jump to the writer's, as the writer asks.
// It reports the outcome to w, so that a failed apply makes the next sync
// full, and returns what w rendered.
func Apply(ctx context.Context, w *iptables.Writer, ipt iptables.Interface, in *proxy.FamilyInput) (iptables.SyncResult, error) {
	res := w.Sync(ctx, in)
	var err error
	if res.Full {
		err = w.EnsureJumpRules(ctx, ipt)
	}
	if err == nil && len(res.Payload) > 0 {
		err = ipt.RestoreAll(ctx, res.Payload, iptables.NoFlushTables, iptables.RestoreCounters)
	}
	w.Applied(err)
	if err != nil {
		return res, fmt.Errorf("applying a sync of %d lines: %w", res.Lines, err)
	}
	return res, nil
}
