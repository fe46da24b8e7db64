package iptables

import (
	"bytes"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxykit/proxykit/proxy"
)

// modeMetrics are iptables mode's own metrics, each by ip_family.
type modeMetrics struct {
	restoreFailures, partialRestoreFailures, driftRepairs *prometheus.CounterVec
	// rulesTotal and rulesLast are kube-proxy's rule counts, by table
	// and ip_family (see ruleTally).
	rulesTotal, rulesLast *prometheus.GaugeVec
}

// RestoreFailuresMetric is kube-proxy's counter of failed iptables-restore
// runs, by ip_family; IPVS mode, which restores its few rules with
// iptables-restore too, counts on it.
func RestoreFailuresMetric(m *proxy.Metrics) (*prometheus.CounterVec, error) {
	return m.CounterVec(prometheus.CounterOpts{Subsystem: proxy.MetricsSubsystem, Name: "sync_proxy_rules_iptables_restore_failures_total",
		Help: "iptables-restore runs that failed."}, []string{"ip_family"})
}

// newModeMetrics makes iptables mode's metrics on m.
func newModeMetrics(m *proxy.Metrics) (modeMetrics, error) {
	var mm modeMetrics
	var err error
	if mm.restoreFailures, err = RestoreFailuresMetric(m); err != nil {
		return mm, err
	}
	if mm.partialRestoreFailures, err = m.CounterVec(prometheus.CounterOpts{Subsystem: proxy.MetricsSubsystem, Name: "sync_proxy_rules_iptables_partial_restore_failures_total",
		Help: "iptables-restore runs of partial syncs that failed (the next sync is full)."}, []string{"ip_family"}); err != nil {
		return mm, err
	}
	if mm.driftRepairs, err = m.CounterVec(prometheus.CounterOpts{Subsystem: proxy.MetricsSubsystem, Name: "sync_proxy_rules_iptables_drift_repairs_total",
		Help: "Checks that found the top-level iptables chains different from what was applied, each followed by a full sync (a proxykit metric; kube-proxy has none)."}, []string{"ip_family"}); err != nil {
		return mm, err
	}
	byTable := []string{"table", "ip_family"}
	if mm.rulesTotal, err = m.GaugeVec(prometheus.GaugeOpts{Subsystem: proxy.MetricsSubsystem, Name: "sync_proxy_rules_iptables_total",
		Help: "Rules in the proxy's own chains of each table, as of the last applied sync."}, byTable); err != nil {
		return mm, err
	}
	mm.rulesLast, err = m.GaugeVec(prometheus.GaugeOpts{Subsystem: proxy.MetricsSubsystem, Name: "sync_proxy_rules_iptables_last",
		Help: "Rules that the last applied sync added to each table (a sync that changed nothing adds none)."}, byTable)
	return mm, err
}

// ruleTables are the tables whose rules the gauges count, as kube-proxy's.
var ruleTables = []Table{TableFilter, TableNAT}

// setRules sets the rule gauges of family from t and the rules the last
// payload wrote.
func (mm modeMetrics) setRules(family string, t *ruleTally, written map[Table]int) {
	for _, table := range ruleTables {
		mm.rulesTotal.WithLabelValues(string(table), family).Set(float64(t.total[table]))
		mm.rulesLast.WithLabelValues(string(table), family).Set(float64(written[table]))
	}
}

// ruleTally counts the rules of the writer's chains per table, from the
// payloads applied: kube-proxy's sync_proxy_rules_iptables_total. kube-proxy
// rewrites every chain but the unchanged service ones in each sync and counts
// what it wrote and what it skipped; the writer's partial syncs edit
// top-level chains rule by rule instead, so the count is kept across
// payloads: a declared chain is flushed, "-A" and "-I" add a rule, "-D"
// removes one, "-X" deletes the chain. A full payload declares every chain
// the writer keeps, so it starts the count afresh. The jumps from the
// built-in chains (EnsureJumpRules) are not counted, as kube-proxy does not
// count them. Its cost is that of reading the payload once, with a map
// look-up per run of one chain's lines.
type ruleTally struct {
	// chains holds each table's chains and their rules. The counts are
	// pointers, and a full payload zeroes them rather than clearing the
	// map, so that a chain seen before costs no allocation.
	chains map[Table]map[string]*int
	total  map[Table]int
}

// note updates t from payload, which has just been applied, and returns
// the rules it added per table: kube-proxy's sync_proxy_rules_iptables_last.
func (t *ruleTally) note(payload []byte, full bool) map[Table]int {
	if t.chains == nil {
		t.chains, t.total = map[Table]map[string]*int{}, map[Table]int{}
	}
	if full {
		for _, chains := range t.chains {
			for _, n := range chains {
				*n = 0
			}
		}
		clear(t.total)
	}
	written := map[Table]int{}
	var chains map[string]*int
	var table Table
	// last and count are the chain of the previous line and its count.
	var last []byte
	var count *int
	chain := func(name []byte) *int {
		if count != nil && bytes.Equal(name, last) {
			return count
		}
		n := chains[string(name)]
		if n == nil {
			n = new(int)
			chains[string(name)] = n
		}
		last, count = name, n
		return n
	}
	for len(payload) > 0 {
		var line []byte
		line, payload, _ = bytes.Cut(payload, []byte{'\n'})
		if len(line) < 2 {
			continue
		}
		if line[0] == '*' {
			table = Table(line[1:])
			if chains = t.chains[table]; chains == nil {
				chains = map[string]*int{}
				t.chains[table] = chains
			}
			last, count = nil, nil
			continue
		}
		if chains == nil {
			continue
		}
		if line[0] == ':' {
			name, _, _ := bytes.Cut(line[1:], []byte{' '})
			n := chain(name)
			t.total[table] -= *n
			*n = 0
			continue
		}
		if len(line) < 3 || line[0] != '-' || line[2] != ' ' {
			continue
		}
		name, _, _ := bytes.Cut(line[3:], []byte{' '})
		switch line[1] {
		case 'A', 'I':
			*chain(name)++
			t.total[table]++
			written[table]++
		case 'D':
			if n := chain(name); *n > 0 {
				*n--
				t.total[table]--
			}
		case 'X':
			t.total[table] -= *chain(name)
			delete(chains, string(name))
			last, count = nil, nil
		}
	}
	return written
}
