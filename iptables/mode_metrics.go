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
// count them. Its cost is a look at each line of the payload, with a map
// look-up per run of one chain's lines; a Mode's tally reads the payload
// in the writer's own walk of it (Writer.noteAppliedChains), so that a
// sync reads its payload once after applying it.
type ruleTally struct {
	// chains holds each table's chains and their rules. The counts are
	// pointers, and a full payload zeroes them rather than clearing the
	// map, so that a chain seen before costs no allocation.
	chains map[Table]map[string]*int
	total  map[Table]int
	// written is what the last payload added per table: kube-proxy's
	// sync_proxy_rules_iptables_last.
	written map[Table]int

	// The payload being read: its current table and that table's chains,
	// and the chain of the previous line with its count.
	table  Table
	tables map[string]*int
	last   []byte
	count  *int
}

// note updates t from payload, which has just been applied, and returns
// the rules it added per table: kube-proxy's sync_proxy_rules_iptables_last.
func (t *ruleTally) note(payload []byte, full bool) map[Table]int {
	t.start(full)
	for len(payload) > 0 {
		var line []byte
		line, payload, _ = bytes.Cut(payload, []byte{'\n'})
		t.line(line)
	}
	t.end()
	return t.written
}

// start begins the reading of an applied payload, full or partial, which
// line then takes line by line (without the "\n") and end ends.
func (t *ruleTally) start(full bool) {
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
	t.written = map[Table]int{}
	t.table, t.tables, t.last, t.count = "", nil, nil, nil
}

// end forgets the payload, which line's state points into.
func (t *ruleTally) end() { t.tables, t.last, t.count = nil, nil, nil }

// chain returns the count of the chain name of the current table.
func (t *ruleTally) chain(name []byte) *int {
	if t.count != nil && bytes.Equal(name, t.last) {
		return t.count
	}
	n := t.tables[string(name)]
	if n == nil {
		n = new(int)
		t.tables[string(name)] = n
	}
	t.last, t.count = name, n
	return n
}

// line counts one line of the payload.
func (t *ruleTally) line(line []byte) {
	if len(line) < 2 {
		return
	}
	if line[0] == '*' {
		t.table = Table(line[1:])
		if t.tables = t.chains[t.table]; t.tables == nil {
			t.tables = map[string]*int{}
			t.chains[t.table] = t.tables
		}
		t.last, t.count = nil, nil
		return
	}
	if t.tables == nil {
		return
	}
	if line[0] == ':' {
		name, _, _ := bytes.Cut(line[1:], []byte{' '})
		n := t.chain(name)
		t.total[t.table] -= *n
		*n = 0
		return
	}
	if len(line) < 3 || line[0] != '-' || line[2] != ' ' {
		return
	}
	name, _, _ := bytes.Cut(line[3:], []byte{' '})
	switch line[1] {
	case 'A', 'I':
		*t.chain(name)++
		t.total[t.table]++
		t.written[t.table]++
	case 'D':
		if n := t.chain(name); *n > 0 {
			*n--
			t.total[t.table]--
		}
	case 'X':
		t.total[t.table] -= *t.chain(name)
		delete(t.tables, string(name))
		t.last, t.count = nil, nil
	}
}
