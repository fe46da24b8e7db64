package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

// childEnv marks a process started by the driver as a child: main and the
// tests' TestMain run childMain then.
const childEnv = "KPBENCH_CHILD"

type scale struct{ services, endpoints int }

func (s scale) String() string { return fmt.Sprintf("%s×%d", short(s.services), s.endpoints) }

func short(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

func parseScales(s string) ([]scale, error) {
	var out []scale
	for f := range strings.SplitSeq(s, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(f), "x")
		sv, err1 := strconv.Atoi(a)
		ep, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil || sv < 1 || ep < 1 {
			return nil, fmt.Errorf("scale %q: want SERVICESxENDPOINTS, as 10000x10", f)
		}
		out = append(out, scale{sv, ep})
	}
	return out, nil
}

type driverConfig struct {
	scales []scale
	modes  []string
	count  int
	reps   int
	// exe is the binary to run as the children.
	exe string
	// log gets a line per child run.
	log io.Writer
}

// drive runs, for each scale and mode, count rounds of a kube-proxy child
// then a proxykit child, one at a time (kp pk kp pk …), so that both sides
// see the same machine in turn.
func drive(cfg driverConfig) ([]childResult, error) {
	var out []childResult
	for _, sc := range cfg.scales {
		for _, mode := range cfg.modes {
			for round := 1; round <= cfg.count; round++ {
				for _, who := range []string{"kp", "pk"} {
					r, err := runOne(cfg, who, mode, sc)
					if err != nil {
						return out, err
					}
					fmt.Fprintf(cfg.log, "kpbench: %s %s %s round %d/%d:", sc, mode, who, round, cfg.count)
					for _, st := range r.Steps {
						fmt.Fprintf(cfg.log, " %s %s;", st.Step, cpuString(st.CPU))
					}
					fmt.Fprintf(cfg.log, " peak heap %s\n", sizeString(float64(r.PeakHeap)))
					out = append(out, r)
				}
			}
		}
	}
	return out, nil
}

func runOne(cfg driverConfig, who, mode string, sc scale) (childResult, error) {
	cmd := exec.Command(cfg.exe, "-side", who, "-mode", mode,
		"-services", strconv.Itoa(sc.services), "-endpoints", strconv.Itoa(sc.endpoints), "-reps", strconv.Itoa(cfg.reps))
	cmd.Env = append(os.Environ(), childEnv+"=1")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	var r childResult
	if err := cmd.Run(); err != nil {
		return r, fmt.Errorf("%s %s %s: %w\n%s", who, mode, sc, err, tail(stderr.String(), 4000))
	}
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		return r, fmt.Errorf("%s %s %s: reading its result: %w", who, mode, sc, err)
	}
	return r, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// table renders the medians over the rounds, one row per scale, mode and
// step, then the heap rows, as Markdown.
func table(results []childResult) string {
	type key struct {
		sc   scale
		mode string
	}
	var keys []key
	by := map[key]map[string][]childResult{}
	for _, r := range results {
		k := key{scale{r.Services, r.Endpoints}, r.Mode}
		if by[k] == nil {
			by[k] = map[string][]childResult{}
			keys = append(keys, k)
		}
		by[k][r.Side] = append(by[k][r.Side], r)
	}
	var b strings.Builder
	b.WriteString("| size | mode | step | kube-proxy | proxykit | kp / pk | to the kernel tool: kube-proxy | proxykit |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, k := range keys {
		kp, pk := by[k]["kp"], by[k]["pk"]
		for _, st := range steps {
			kc, pc := median(kp, func(r childResult) float64 { return float64(stepOf(r, st).CPU) }), median(pk, func(r childResult) float64 { return float64(stepOf(r, st).CPU) })
			kb, pb := median(kp, func(r childResult) float64 { return float64(stepOf(r, st).Bytes) }), median(pk, func(r childResult) float64 { return float64(stepOf(r, st).Bytes) })
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", k.sc, k.mode, st,
				cpuString(time.Duration(kc)), cpuString(time.Duration(pc)), ratio(kc, pc), sizeString(kb), sizeString(pb))
		}
		for _, h := range []struct {
			name string
			get  func(childResult) float64
		}{
			{"peak heap", func(r childResult) float64 { return float64(r.PeakHeap) }},
			{"retained heap", func(r childResult) float64 { return float64(r.RetainedHeap) }},
			{"peak RSS", func(r childResult) float64 { return float64(r.PeakRSS) }},
		} {
			kv, pv := median(kp, h.get), median(pk, h.get)
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | | |\n", k.sc, k.mode, h.name, sizeString(kv), sizeString(pv), ratio(kv, pv))
		}
	}
	return b.String()
}

func stepOf(r childResult, name string) stepResult {
	for _, s := range r.Steps {
		if s.Step == name {
			return s
		}
	}
	return stepResult{}
}

func median(rs []childResult, get func(childResult) float64) float64 {
	if len(rs) == 0 {
		return 0
	}
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = get(r)
	}
	slices.Sort(v)
	if n := len(v); n%2 == 0 {
		return (v[n/2-1] + v[n/2]) / 2
	}
	return v[len(v)/2]
}

func ratio(kp, pk float64) string {
	if pk <= 0 || kp <= 0 {
		return "—"
	}
	r := kp / pk
	switch {
	case r >= 100:
		return fmt.Sprintf("%.0f×", r)
	case r >= 10:
		return fmt.Sprintf("%.1f×", r)
	default:
		return fmt.Sprintf("%.2f×", r)
	}
}

func cpuString(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/1e6)
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.0f µs", float64(d)/1e3)
	}
}

func sizeString(b float64) string {
	switch {
	case b >= 1e9:
		return fmt.Sprintf("%.2f GB", b/1e9)
	case b >= 1e6:
		return fmt.Sprintf("%.1f MB", b/1e6)
	case b >= 1e3:
		return fmt.Sprintf("%.1f kB", b/1e3)
	default:
		return fmt.Sprintf("%.0f B", b)
	}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func driverMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kpbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	scales := fs.String("scales", "1000x10,10000x10", "comma-separated SERVICESxENDPOINTS")
	modes := fs.String("modes", "iptables,nftables", "comma-separated modes")
	count := fs.Int("count", 3, "processes per side, scale and mode (alternating kube-proxy and proxykit)")
	reps := fs.Int("reps", 5, "operations of each small step within a process")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	sc, err := parseScales(*scales)
	if err == nil && *count < 1 {
		err = errors.New("count must be positive")
	}
	var ms []string
	for m := range strings.SplitSeq(*modes, ",") {
		if m = strings.TrimSpace(m); m != "iptables" && m != "nftables" {
			err = fmt.Errorf("mode %q: want iptables or nftables", m)
		}
		ms = append(ms, m)
	}
	if err != nil {
		fmt.Fprintln(stderr, "kpbench:", err)
		return 2
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, "kpbench:", err)
		return 1
	}
	start, load0 := time.Now(), loadavg()
	results, err := drive(driverConfig{scales: sc, modes: ms, count: *count, reps: *reps, exe: exe, log: stderr})
	if err != nil {
		fmt.Fprintln(stderr, "kpbench:", err)
		return 1
	}
	fmt.Fprintf(stdout, "CPU (user+sys) per operation, median of %d processes per side; kube-proxy and proxykit processes alternated. %s; load average %s at the start, %s at the end; %s.\n\n",
		*count, start.UTC().Format("2006-01-02 15:04 MST"), load0, loadavg(), time.Since(start).Round(time.Second))
	fmt.Fprint(stdout, table(results))
	return 0
}
