package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"golang.org/x/sys/unix"
)

// side is one proxy under measurement, fed object by object and synced by
// hand.
type side interface {
	service(old, cur *v1.Service)
	slice(old, cur *discoveryv1.EndpointSlice)
	// sync runs one sync of what is pending.
	sync() error
	// requestFull makes the next sync full.
	requestFull()
	// bytes is the total handed to the kernel tool so far.
	bytes() int64
	// kernelCPU is the stand-in kernel's own CPU time so far, which is
	// not the proxy's.
	kernelCPU() time.Duration
}

// The steps, in the order a child runs them.
const (
	stepFirst     = "first full sync"
	stepEndpoint  = "one-endpoint change"
	stepAdd       = "Service add"
	stepUnchanged = "unchanged resync"
	stepForced    = "forced full resync"
)

var steps = []string{stepFirst, stepEndpoint, stepAdd, stepUnchanged, stepForced}

// stepResult is one step's cost per operation.
type stepResult struct {
	Step string
	Ops  int
	// CPU is the process's user+sys time (getrusage), less the stand-in
	// kernel's, per operation.
	CPU   time.Duration
	Wall  time.Duration
	Bytes int64
}

// childResult is what a child prints, as JSON, on its stdout.
type childResult struct {
	Side      string
	Mode      string
	Services  int
	Endpoints int
	Steps     []stepResult
	// PeakHeap is the most heap in use (live and not yet collected
	// objects, sampled every millisecond and at the end of each step)
	// above what it was before the first step, when the workload's
	// objects and the proxy were made.
	PeakHeap uint64
	// RetainedHeap is the live heap after the last step and a GC, above
	// the same base.
	RetainedHeap uint64
	// PeakRSS is the process's VmHWM.
	PeakRSS uint64
}

func childMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kpbench child", flag.ContinueOnError)
	fs.SetOutput(stderr)
	who := fs.String("side", "", "kp (kube-proxy) or pk (proxykit)")
	mode := fs.String("mode", "", "iptables or nftables")
	services := fs.Int("services", 1000, "Services")
	endpoints := fs.Int("endpoints", 10, "endpoints per Service")
	reps := fs.Int("reps", 5, "operations of each small step (one-endpoint change, Service add, unchanged resync)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the first full sync to this file")
	memProfile := fs.String("memprofile", "", "write an allocation profile of the first full sync (every allocation sampled; FILE.base holds what came before, for pprof -base) to this file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	res, err := runChild(*who, *mode, *services, *endpoints, *reps, profiles{cpu: *cpuProfile, mem: *memProfile})
	if err != nil {
		fmt.Fprintf(stderr, "kpbench child %s %s %dx%d: %v\n", *who, *mode, *services, *endpoints, err)
		return 1
	}
	if err := json.NewEncoder(stdout).Encode(res); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// profiles names the files a child writes its first full sync's profiles
// to; empty names write none.
type profiles struct{ cpu, mem string }

func runChild(who, mode string, services, endpoints, reps int, prof profiles) (*childResult, error) {
	if services < 1 || endpoints < 1 || reps < 1 {
		return nil, fmt.Errorf("services, endpoints and reps must be positive")
	}
	var s side
	var err error
	switch who {
	case "kp":
		switch mode {
		case "iptables":
			s, err = newKubeProxyIPTables(context.Background())
		case "nftables":
			s, err = newKubeProxyNFTables(context.Background())
		default:
			err = fmt.Errorf("unknown mode %q", mode)
		}
	case "pk":
		s, err = newProxyKit(mode)
	default:
		err = fmt.Errorf("unknown side %q", who)
	}
	if err != nil {
		return nil, err
	}

	// Every object the steps feed is made before the measurements.
	w := newWorkload(services, endpoints)
	initialSvcs, initialSlices := slices.Clone(w.svcs), slices.Clone(w.slices)
	type move struct{ old, cur *discoveryv1.EndpointSlice }
	moves := make([]move, reps)
	for i := range moves {
		// Spread over the Services, never the same one twice in a row.
		moves[i].old, moves[i].cur = w.moveEndpoint(i * (services/reps + 1) % services)
	}
	type add struct {
		svc   *v1.Service
		slice *discoveryv1.EndpointSlice
	}
	adds := make([]add, reps)
	for i := range adds {
		adds[i].svc, adds[i].slice = w.addService()
	}

	res := &childResult{Side: who, Mode: mode, Services: services, Endpoints: endpoints}
	runtime.GC()
	base := heapObjects()
	peak := startPeakSampler()

	run := func(name string, ops int, op func(i int) error) error {
		runtime.GC()
		cpu0, wall0, b0, k0 := processCPU(), time.Now(), s.bytes(), s.kernelCPU()
		for i := range ops {
			if err := op(i); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
		peak.sample()
		cpu := processCPU() - cpu0 - (s.kernelCPU() - k0)
		res.Steps = append(res.Steps, stepResult{
			Step: name, Ops: ops,
			CPU:   cpu / time.Duration(ops),
			Wall:  time.Since(wall0) / time.Duration(ops),
			Bytes: (s.bytes() - b0) / int64(ops),
		})
		return nil
	}
	if err := run(stepFirst, 1, func(int) error {
		stop, err := prof.start()
		if err != nil {
			return err
		}
		for i := range services {
			s.service(nil, initialSvcs[i])
			s.slice(nil, initialSlices[i])
		}
		if err := s.sync(); err != nil {
			return err
		}
		return stop()
	}); err != nil {
		return nil, err
	}
	if err := run(stepEndpoint, reps, func(i int) error {
		s.slice(moves[i].old, moves[i].cur)
		return s.sync()
	}); err != nil {
		return nil, err
	}
	if err := run(stepAdd, reps, func(i int) error {
		s.service(nil, adds[i].svc)
		s.slice(nil, adds[i].slice)
		return s.sync()
	}); err != nil {
		return nil, err
	}
	if err := run(stepUnchanged, reps, func(int) error { return s.sync() }); err != nil {
		return nil, err
	}
	if err := run(stepForced, 1, func(int) error {
		s.requestFull()
		return s.sync()
	}); err != nil {
		return nil, err
	}
	res.PeakHeap = sub(peak.stop(), base)
	runtime.GC()
	res.RetainedHeap = sub(heapObjects(), base)
	runtime.KeepAlive(s)
	res.PeakRSS = vmHWM()
	return res, nil
}

func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// processCPU is the process's user and system time so far.
func processCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

const heapMetric = "/memory/classes/heap/objects:bytes"

// heapObjects is the heap's live objects and those not yet swept.
func heapObjects() uint64 {
	s := []metrics.Sample{{Name: heapMetric}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

type peakSampler struct {
	mu   sync.Mutex
	max  uint64
	done chan struct{}
	wg   sync.WaitGroup
}

func startPeakSampler() *peakSampler {
	p := &peakSampler{done: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-t.C:
				p.sample()
			}
		}
	}()
	return p
}

func (p *peakSampler) sample() {
	v := heapObjects()
	p.mu.Lock()
	p.max = max(p.max, v)
	p.mu.Unlock()
}

func (p *peakSampler) stop() uint64 {
	close(p.done)
	p.wg.Wait()
	p.sample()
	return p.max
}

// vmHWM is the process's peak resident set, from /proc/self/status.
func vmHWM() uint64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// start begins the profiles p names; the returned function ends them and
// writes the files. The allocation profile samples every allocation (which
// slows the step it profiles), so a run that profiles is not one to
// measure.
func (p profiles) start() (stop func() error, err error) {
	var cpuFile *os.File
	if p.cpu != "" {
		if cpuFile, err = os.Create(p.cpu); err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(cpuFile); err != nil {
			cpuFile.Close()
			return nil, err
		}
	}
	if p.mem != "" {
		// The allocation profile counts from the process's start; the
		// base, written now, lets pprof -base leave out the workload's
		// making.
		runtime.MemProfileRate = 1
		if err := writeAllocs(p.mem + ".base"); err != nil {
			return nil, err
		}
	}
	return func() error {
		if cpuFile != nil {
			pprof.StopCPUProfile()
			if err := cpuFile.Close(); err != nil {
				return err
			}
		}
		if p.mem == "" {
			return nil
		}
		return writeAllocs(p.mem)
	}, nil
}

func writeAllocs(name string) error {
	// The allocation profile holds what was allocated up to the last GC.
	runtime.GC()
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
