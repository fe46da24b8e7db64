package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/yaml"

	"github.com/proxykit/proxykit/internal/testkit/clustertest"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
)

// manifestsBenchPerFile is how many Services (each with its slice) one
// manifest file of BenchmarkManifestsProxier holds.
const manifestsBenchPerFile = 1000

// manifestsBenchEdits is how many Service edits BenchmarkManifestsProxier
// times.
const manifestsBenchEdits = 20

// BenchmarkManifestsProxier runs the proxier in nftables mode with
// --manifests on 10,000 Services of 10 endpoints each, in files of 1,000
// Services and their slices, in a network namespace of its own, and
// reports its resident memory once the first full sync is done and after
// the edits, and the time from an edit of one Service (its port, in a
// 1,000-Service file replaced as editors replace files) to the end of the
// sync that applies it, as the proxier's last-sync metric reports it: p50,
// p95 and max over 20 edits, each after a pause longer than the minimum
// sync period. The sync period is an hour, so that no periodic sync ends
// between an edit and its own. It measures; it asserts nothing about the
// figures. The body runs once, whatever b.N:
//
//	go test -run '^$' -bench '^BenchmarkManifestsProxier$' -benchtime 1x -timeout 20m ./examples/proxier
func BenchmarkManifestsProxier(b *testing.B) {
	kerneltest.Require(b, e2eModes[2].tools(false)...)
	const services, endpoints = 10000, 10
	objs := clustertest.Cluster(services, endpoints)
	var svcs []*v1.Service
	var eps []*discoveryv1.EndpointSlice
	dir := b.TempDir()
	for _, o := range objs {
		switch o := o.(type) {
		case *v1.Service:
			svcs = append(svcs, o)
		case *discoveryv1.EndpointSlice:
			eps = append(eps, o)
		default:
			y, err := yaml.Marshal(o)
			if err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "node.yaml"), y, 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	writeFile := func(chunk int) {
		b.Helper()
		data := manifestChunk(b, svcs, eps, chunk*manifestsBenchPerFile, min(services, (chunk+1)*manifestsBenchPerFile))
		name := filepath.Join(dir, fmt.Sprintf("services-%02d.yaml", chunk))
		if err := os.WriteFile(name+".tmp", data, 0o644); err != nil {
			b.Fatal(err)
		}
		if err := os.Rename(name+".tmp", name); err != nil {
			b.Fatal(err)
		}
	}
	for c := range services / manifestsBenchPerFile {
		writeFile(c)
	}

	ns := kerneltest.NewNS(b)
	var log logBuffer
	cmd := exec.Command(proxierBinary(b), "--mode", modeNFTables, "--manifests", dir, "--hostname-override", "node-a",
		"--cluster-cidr", "10.128.0.0/10", "--healthz-bind-address", "", "--metrics-bind-address", "127.0.0.1:10249",
		"--sync-period", "1h", "--min-sync-period", "1s")
	cmd.Env = append(os.Environ(), "XTABLES_LOCKFILE="+filepath.Join(b.TempDir(), "xtables.lock"))
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := ns.Do(cmd.Start); err != nil {
		b.Fatal(err)
	}
	proc := &dropInProc{name: "proxier", cmd: cmd}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if b.Failed() {
			b.Logf("proxier log:\n%s", log.String())
		}
	})
	b.Logf("proxier pid %d; load %s", cmd.Process.Pid, loadAvg())
	get := nsGet(ns)
	metrics := func() map[string]float64 {
		b.Helper()
		m, err := scrape(get, "http://127.0.0.1:10249/metrics")
		if err != nil {
			b.Fatal(err)
		}
		return m
	}
	const (
		fullCount    = `kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="IPv4"}`
		lastSync     = `kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`
		partialSum   = `kubeproxy_sync_partial_proxy_rules_duration_seconds_sum{ip_family="IPv4"}`
		partialCount = `kubeproxy_sync_partial_proxy_rules_duration_seconds_count{ip_family="IPv4"}`
	)
	eventually(b, 10*time.Minute, "the first full sync", func() error {
		if _, _, err := get("http://127.0.0.1:10249/metrics"); err != nil {
			return err
		}
		if metrics()[fullCount] < 1 {
			return fmt.Errorf("no full sync yet")
		}
		return nil
	})
	time.Sleep(5 * time.Second)
	rssSynced := proc.rss(b)

	var latencies []time.Duration
	before := metrics()
	for e := range manifestsBenchEdits {
		time.Sleep(1500 * time.Millisecond)
		i := (e*services/manifestsBenchEdits + e*7) % services
		svcs[i].Spec.Ports[0].Port = 80 + int32(e%2) + 1
		start := time.Now()
		writeFile(i / manifestsBenchPerFile)
		eventually(b, time.Minute, "the edit's sync", func() error {
			if at := metrics()[lastSync]; at < float64(start.UnixNano())/1e9 {
				return fmt.Errorf("no sync since the edit")
			}
			return nil
		})
		at := metrics()[lastSync]
		latencies = append(latencies, time.Duration(at*1e9-float64(start.UnixNano())))
	}
	rssEdited := proc.rss(b)
	after := metrics()
	syncs := after[partialCount] - before[partialCount]
	syncMean := time.Duration((after[partialSum] - before[partialSum]) / max(syncs, 1) * 1e9)
	slices.Sort(latencies)
	pct := func(p float64) time.Duration { return latencies[int(p*float64(len(latencies)-1))] }
	var all []string
	for _, l := range latencies {
		all = append(all, l.Round(time.Millisecond).String())
	}
	b.Logf("load %s; RSS after the first sync %d MB, after %d edits %d MB; edit to sync end p50 %v p95 %v max %v (%s); %v partial syncs, mean %v",
		loadAvg(), rssSynced>>20, len(latencies), rssEdited>>20, pct(0.5).Round(time.Millisecond), pct(0.95).Round(time.Millisecond),
		latencies[len(latencies)-1].Round(time.Millisecond), strings.Join(all, " "), syncs, syncMean.Round(time.Millisecond))
	b.ReportMetric(float64(rssSynced>>20), "MB-rss-synced")
	b.ReportMetric(float64(rssEdited>>20), "MB-rss-edited")
	b.ReportMetric(float64(pct(0.95).Milliseconds()), "ms-edit-p95")
	for range b.N {
	}
}

// nsGet returns a function that GETs a URL from inside ns, and returns the
// status and the body.
func nsGet(ns *kerneltest.NS) func(url string) (int, string, error) {
	return func(url string) (int, string, error) {
		tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := ns.Do(func() (err error) {
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		}}
		c := http.Client{Transport: tr, Timeout: 10 * time.Second}
		resp, err := c.Get(url)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		var body bytes.Buffer
		_, err = body.ReadFrom(resp.Body)
		return resp.StatusCode, body.String(), err
	}
}
