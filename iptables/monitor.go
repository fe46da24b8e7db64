package iptables

import (
	"context"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// canaryRule is the rule Monitor keeps in each canary chain. An empty
// chain survives "iptables -F", which empties every chain of a table; a
// chain with a rule in it shows the flush.
var canaryRule = []string{"-j", "RETURN"}

const (
	// flushTimeout bounds the wait, after one canary went, for the
	// others: a firewalld reload or a script flushes tables one by one,
	// and resyncing half-way would be undone by the rest of it.
	flushTimeout = 5 * time.Second
	// flushPollInterval is how often the canaries are checked during that
	// wait.
	flushPollInterval = 100 * time.Millisecond
)

// MonitorCanary is the loop behind [Interface.Monitor], for ipt, waiting on
// clk. It is exported so that other implementations of Interface (such as
// the Fake in iptables/iptablestest) behave exactly like the real one; callers
// use Interface.Monitor.
//
// It creates canary, holding one rule ("-j RETURN"), in each of tables,
// retrying every interval until that works. Then every interval it checks
// that each canary still holds its rule; when one does not (the chain was
// deleted or flushed) it polls every 100ms, for at most 5s, until all of
// them are gone, recreates them, and calls reloadFunc. Errors from ipt are
// logged through the logger in ctx and never count as a missing canary.
// MonitorCanary returns when ctx is done, without calling reloadFunc.
func MonitorCanary(ctx context.Context, ipt Interface, clk clock.Clock, canary Chain, tables []Table, reloadFunc func(), interval time.Duration) {
	logger := klog.FromContext(ctx).WithValues("canary", canary)
	if len(tables) == 0 || interval <= 0 || reloadFunc == nil {
		logger.Error(nil, "Not monitoring iptables: need tables, a positive interval and a reload function", "tables", tables, "interval", interval)
		return
	}
	ctx = klog.NewContext(ctx, logger)
	m := monitor{ipt: ipt, clk: clk, canary: canary, tables: tables}
	installed := m.install(ctx)
	for {
		if !m.wait(ctx, interval) {
			return
		}
		if !installed {
			installed = m.install(ctx)
			continue
		}
		gone, err := m.firstMissing(ctx)
		if err != nil {
			logger.Error(err, "Could not check the iptables canary")
			continue
		}
		if gone == "" {
			continue
		}
		logger.Info("iptables canary gone: another program flushed or deleted rules", "table", gone)
		if !m.waitAllGone(ctx) {
			return
		}
		installed = m.install(ctx)
		if ctx.Err() != nil {
			return
		}
		reloadFunc()
	}
}

type monitor struct {
	ipt    Interface
	clk    clock.Clock
	canary Chain
	tables []Table
}

// wait waits d on the clock and reports whether ctx is still live.
func (m *monitor) wait(ctx context.Context, d time.Duration) bool {
	t := m.clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// install creates the canaries and reports whether all of them exist.
func (m *monitor) install(ctx context.Context) bool {
	for _, table := range m.tables {
		if _, err := m.ipt.EnsureChain(ctx, table, m.canary); err != nil {
			klog.FromContext(ctx).Error(err, "Could not create the iptables canary", "table", table)
			return false
		}
		if _, err := m.ipt.EnsureRule(ctx, Append, table, m.canary, canaryRule...); err != nil {
			klog.FromContext(ctx).Error(err, "Could not create the iptables canary", "table", table)
			return false
		}
	}
	return true
}

// firstMissing returns the first table whose canary is deleted or flushed,
// or "" if all are there.
func (m *monitor) firstMissing(ctx context.Context) (Table, error) {
	for _, table := range m.tables {
		ok, err := m.ipt.RuleExists(ctx, table, m.canary, canaryRule...)
		if err != nil {
			return "", err
		}
		if !ok {
			return table, nil
		}
	}
	return "", nil
}

// waitAllGone polls until no canary is left or flushTimeout has passed.
// It reports whether ctx is still live.
func (m *monitor) waitAllGone(ctx context.Context) bool {
	start := m.clk.Now()
	for {
		left := 0
		for _, table := range m.tables {
			ok, err := m.ipt.RuleExists(ctx, table, m.canary, canaryRule...)
			if err != nil || ok {
				left++
			}
		}
		if left == 0 {
			return true
		}
		if m.clk.Since(start) >= flushTimeout {
			klog.FromContext(ctx).V(2).Info("Some iptables canaries survived; resyncing anyway", "left", left)
			return true
		}
		if !m.wait(ctx, flushPollInterval) {
			return false
		}
	}
}
