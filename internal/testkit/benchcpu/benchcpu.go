// Package benchcpu reports a benchmark loop's process CPU time as the
// "cpu-ns/op" metric. On a shared machine it is steadier than wall time,
// which also counts the time spent waiting for a CPU; it counts every
// thread of the process, so garbage-collector work is included.
package benchcpu

import (
	"testing"
	"time"
)

// Clock holds the process's CPU time at the start of a loop.
type Clock struct{ start time.Duration }

// Start reads the process's CPU time; call it just before the loop.
func Start() Clock { return Clock{start: processCPU()} }

// Report adds the CPU time since Start, per iteration, to b's results as
// "cpu-ns/op". It reports nothing when b ran no iteration, or 0 where the
// platform cannot read the time.
func (c Clock) Report(b *testing.B) {
	if b.N > 0 {
		b.ReportMetric(float64(processCPU()-c.start)/float64(b.N), "cpu-ns/op")
	}
}
