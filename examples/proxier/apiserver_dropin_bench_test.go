package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/proxykit/proxykit/internal/testkit/apiservertest"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
)

// dropInChanges is how many EndpointSlice writes each stage of
// BenchmarkAPIServerDropIn times.
const dropInChanges = 100

// dropInChangeGap is how long BenchmarkAPIServerDropIn waits, once both
// proxiers applied a write, before the next: longer than their minimum
// sync period (1s), so that neither write waits for it, whichever of the
// two was the last to sync.
const dropInChangeGap = 1500 * time.Millisecond

// dropInFillerEndpoints is how many endpoints each filler Service has.
const dropInFillerEndpoints = 10

// BenchmarkAPIServerDropIn records, side by side from one run, what the
// real kube-proxy and this proxier cost on the same node (see
// TestAPIServerDropIn for the worlds), per mode, with 1,000 and then
// 10,000 Services of 10 endpoints each on the API server: the time from an
// EndpointSlice write to the first connection that follows it in each
// node's kernel (p50 and p99 over 100 writes, each once both applied the
// previous one and their minimum sync period passed), the CPU time each
// process spent on those writes, its resident memory after them, and how
// long and how much CPU time each took to serve the stage's Services.
// Both run with kube-proxy's default sync periods (30s, 1s). It measures;
// it asserts nothing about the figures. The body runs once, whatever b.N:
//
//	PROXYKIT_APISERVER_BIN=$(hack/apiserver/build.sh) go test -run '^$' \
//	    -bench '^BenchmarkAPIServerDropIn$' -benchtime 1x -timeout 60m ./examples/proxier
func BenchmarkAPIServerDropIn(b *testing.B) {
	for _, m := range dropInModes {
		b.Run(m.mode, func(b *testing.B) {
			dc := newDropInCluster(b)
			dc.putNode(b, e2eNodeIP)
			kp, ours := dc.newDropInWorld(b, "kube-proxy"), dc.newDropInWorld(b, "proxykit")
			worlds := []*dropInWorld{kp, ours}
			web := dropInSlice("web", 0, "pod-a")
			if _, err := dc.kube.CoreV1().Services(e2eNS).Create(context.Background(), apiService("web", "10.96.0.10"), metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			dc.writeSlice(b, web)
			args := m.args(b, dc.c.APIServer(0).Kubeconfig(b), "30s", "1s")
			ourBinary := proxierBinary(b) // built before any timing
			created := 1
			for _, n := range []int{1000, 10000} {
				load := loadAvg()
				// The first stage is timed from the proxiers' start, with
				// the Services already there; the second, whose Services
				// are written while they run, from its last write (its CPU
				// time counts from its first).
				var from time.Time
				var cpu0 [2]time.Duration
				written := time.Now()
				if kp.proc == nil {
					dc.createFillers(b, created, n)
					from = time.Now()
					kp.start(b, apiservertest.KubeProxy(dc.bin), args...)
					ours.start(b, ourBinary, args...)
				} else {
					for i, w := range worlds {
						cpu0[i] = w.proc.cpu(b)
					}
					dc.createFillers(b, created, n)
					from = time.Now()
				}
				b.Logf("%s: %d Services written in %v", m.mode, n-created, time.Since(written).Round(time.Second))
				created = n
				// The last write, after every filler, to a pod web has
				// not had: once it is served, the proxier has the whole
				// stage.
				web.Endpoints = dropInSlice("web", 0, "pod-c").Endpoints
				dc.writeSlice(b, web)
				var reach [2]time.Duration
				var wg sync.WaitGroup
				for i, w := range worlds {
					wg.Go(func() { reach[i] = w.waitFor(b, "pod-c", from, 10*time.Minute) })
				}
				wg.Wait()
				var cpuReach [2]time.Duration
				for i, w := range worlds {
					cpuReach[i] = w.proc.cpu(b) - cpu0[i]
				}

				var lat [2][]time.Duration
				var cpu1 [2]time.Duration
				for i, w := range worlds {
					cpu1[i] = w.proc.cpu(b)
				}
				for c := range dropInChanges {
					time.Sleep(dropInChangeGap)
					pod := []string{"pod-a", "pod-b"}[c%2]
					web.Endpoints = dropInSlice("web", 0, pod).Endpoints
					start := time.Now()
					dc.writeSlice(b, web)
					for i, w := range worlds {
						wg.Go(func() { lat[i] = append(lat[i], w.waitFor(b, pod, start, time.Minute)) })
					}
					wg.Wait()
				}
				var rows []string
				for i, w := range worlds {
					slices.Sort(lat[i])
					p50, p99 := lat[i][len(lat[i])/2], lat[i][len(lat[i])*99/100-1]
					cpu := w.proc.cpu(b) - cpu1[i]
					rss := w.proc.rss(b)
					rows = append(rows, fmt.Sprintf("| %s | %s | %d | %v | %v | %v | %.2f | %d | %v |",
						m.mode, w.name, n, p50.Round(time.Millisecond), p99.Round(time.Millisecond),
						reach[i].Round(100*time.Millisecond), cpuReach[i].Seconds(), rss>>20, cpu.Round(10*time.Millisecond)))
					b.ReportMetric(float64(p50.Milliseconds()), fmt.Sprintf("%s-%d-p50-ms", w.name, n))
					b.ReportMetric(float64(p99.Milliseconds()), fmt.Sprintf("%s-%d-p99-ms", w.name, n))
					b.ReportMetric(float64(rss>>20), fmt.Sprintf("%s-%d-rss-MiB", w.name, n))
				}
				b.Logf("load average before %s, after %s\n| mode | proxier | Services | write to kernel p50 | p99 | stage served after | CPU s to serve it | RSS MiB | CPU for %d writes |\n%s",
					load, loadAvg(), dropInChanges, strings.Join(rows, "\n"))
			}
		})
	}
}

// dropInSlice is the IPv4 slice of Service name with the pods given, the
// nth filler's when pods is empty (endpoints in 10.128/9, none of them a
// real pod).
func dropInSlice(name string, n int, pods ...string) *discoveryv1.EndpointSlice {
	if len(pods) > 0 {
		return apiSlice(name, pods...)
	}
	s := apiSlice(name)
	for j := range dropInFillerEndpoints {
		k := n*dropInFillerEndpoints + j
		addr := fmt.Sprintf("10.%d.%d.%d", 128+k>>16, k>>8&0xff, k&0xff)
		node := "node-b"
		if j == 0 {
			node = "node-a"
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{addr}, NodeName: &node,
			Conditions: discoveryv1.EndpointConditions{Ready: new(true)},
		})
	}
	return s
}

// createFillers writes Services filler-from to filler-(to-1), each with
// a cluster IP the API server allocates and a slice, from a few writers
// at once.
func (dc *dropInCluster) createFillers(t testing.TB, from, to int) {
	t.Helper()
	work := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for n := range work {
				name := "filler-" + strconv.Itoa(n)
				svc := apiService(name, "", func(s *v1.Service) { s.Spec.Ports[0].TargetPort = intstr.FromInt32(e2ePodPort) })
				_, err := dc.kube.CoreV1().Services(e2eNS).Create(context.Background(), svc, metav1.CreateOptions{})
				if err == nil {
					_, err = dc.kube.DiscoveryV1().EndpointSlices(e2eNS).Create(context.Background(), dropInSlice(name, n), metav1.CreateOptions{})
				}
				if err != nil {
					select {
					case errs <- fmt.Errorf("%s: %w", name, err):
					default:
					}
				}
			}
		})
	}
	for n := from; n < to; n++ {
		work <- n
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
}

// writeSlice creates s or replaces the slice of its name.
func (dc *dropInCluster) writeSlice(t testing.TB, s *discoveryv1.EndpointSlice) {
	t.Helper()
	slices := dc.kube.DiscoveryV1().EndpointSlices(e2eNS)
	if s.ResourceVersion == "" {
		created, err := slices.Create(context.Background(), s, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.ResourceVersion = created.ResourceVersion
		return
	}
	updated, err := slices.Update(context.Background(), s, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.ResourceVersion = updated.ResourceVersion
}

// waitFor returns how long after since the world's client first reached
// pod through web's cluster IP, polling every millisecond or so; it
// fails t after timeout.
func (w *dropInWorld) waitFor(t testing.TB, pod string, since time.Time, timeout time.Duration) time.Duration {
	dst := netip.MustParseAddrPort("10.96.0.10:80")
	for {
		r, err := kerneltest.DialFrom(w.client, "tcp", netip.Addr{}, dst, 200*time.Millisecond)
		if err == nil && r.Name == pod {
			return time.Since(since)
		}
		if time.Since(since) > timeout {
			t.Errorf("%s: %s not reached within %v", w.name, pod, timeout)
			return timeout
		}
		time.Sleep(time.Millisecond)
	}
}

// cpu returns the CPU time, user and system, the process has used.
func (p *dropInProc) cpu(t testing.TB) time.Duration {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
	// The fields after the command name, which is in parentheses and may
	// hold spaces: utime and stime are the 14th and 15th of the line.
	f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+2:]))
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("%s: /proc stat: %v", p.name, err)
		}
		ticks += n
	}
	// USER_HZ is 100 on every Linux architecture Go supports.
	return time.Duration(ticks) * 10 * time.Millisecond
}

// rss returns the process's resident memory, in bytes.
func (p *dropInProc) rss(t testing.TB) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s: VmRSS: %v", p.name, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("%s: no VmRSS", p.name)
	return 0
}

// loadAvg returns the machine's load averages over 1, 5 and 15 minutes.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return err.Error()
	}
	return strings.Join(strings.Fields(string(data))[:3], " ")
}
