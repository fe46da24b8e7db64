package main

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"
	"sigs.k8s.io/yaml"

	"github.com/proxykit/proxykit/changetracker"
	"github.com/proxykit/proxykit/internal/testkit/clustertest"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxy"
)

// scaleEnv adds 10,000 services to TestProgrammingLatency, and 30,000 in
// nftables mode (iptables mode would take many minutes to load them); it
// then takes minutes.
const scaleEnv = "PROXYKIT_E2E_SCALE"

// triggerPlaceholder stands for the last-change-trigger-time in the YAML
// until the file is written.
const triggerPlaceholder = "2000-01-01T00:00:00Z"

// latencyServicesPerFile is how many Services (with their slices) go in one
// manifest file: an edit re-reads the directory but parses one file.
const latencyServicesPerFile = 100

// TestProgrammingLatency measures, on the kernel, how long the proxier takes
// from an EndpointSlice change to the rules for it being applied, as its
// kubeproxy_network_programming_duration_seconds metric reports it: the
// test writes the change to a manifest file with its time as the slice's
// last-change-trigger-time, the proxier's file watch, informer, tracker,
// runner and partial sync follow, and the metric is observed after the
// restore. Beside it, the test times iptables-restore alone applying the
// same partial payload (rendered by a writer in the test, run through an
// Interface with a lock of its own) in a namespace of its own, and the
// first full restore; in nftables mode, nft -f alone applying the same
// transactions. The figures are logged (go test -v); it runs at 1,000
// services of 10 endpoints in each mode (iptables mode on both backends,
// and nftables mode), and also at 10,000, and at 30,000 in
// nftables mode (minutes), when PROXYKIT_E2E_SCALE=1. In nftables mode it
// also times a change of endpoints alone (no new chain) sent as the
// proxier sends it, one netlink batch, and the same change through nft -f.
func TestProgrammingLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping programming-latency measurements in -short mode")
	}
	scale := os.Getenv(scaleEnv) == "1"
	for _, m := range e2eModes {
		sizes := []int{1000}
		if scale {
			sizes = append(sizes, 10000)
			if m.mode == modeNFTables {
				sizes = append(sizes, 30000)
			}
		}
		for _, services := range sizes {
			t.Run(fmt.Sprintf("%s/%dx10", m.name, services), func(t *testing.T) {
				kerneltest.Require(t, m.tools(false)...)
				testProgrammingLatency(t, m, services, 10)
			})
		}
	}
}

func testProgrammingLatency(t *testing.T, m e2eMode, services, endpoints int) {
	backend := m.backend
	objs := clustertest.Cluster(services, endpoints)
	var svcs []*v1.Service
	var eps []*discoveryv1.EndpointSlice
	var node runtime.Object
	for _, o := range objs {
		switch o := o.(type) {
		case *v1.Service:
			svcs = append(svcs, o)
		case *discoveryv1.EndpointSlice:
			eps = append(eps, o)
		default:
			node = o
		}
	}
	dir := t.TempDir()
	writeChunk := func(chunk int) {
		t.Helper()
		chunkYAML := manifestChunk(t, svcs, eps, chunk*latencyServicesPerFile, min(services, (chunk+1)*latencyServicesPerFile))
		name := filepath.Join(dir, fmt.Sprintf("chunk-%04d.yaml", chunk))
		// The trigger time is taken last, so that the test's own YAML
		// encoding is not counted.
		data := bytes.ReplaceAll(chunkYAML, []byte(triggerPlaceholder), []byte(time.Now().Format(time.RFC3339Nano)))
		if err := os.WriteFile(name+".tmp", data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(name+".tmp", name); err != nil {
			t.Fatal(err)
		}
	}
	nodeYAML, err := yaml.Marshal(node)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "node.yaml"), nodeYAML, 0o644); err != nil {
		t.Fatal(err)
	}
	for c := range (services + latencyServicesPerFile - 1) / latencyServicesPerFile {
		writeChunk(c)
	}

	ns := kerneltest.NewNS(t)
	lockFile := filepath.Join(t.TempDir(), "xtables.lock")
	if _, err := ns.Exec("iptables-"+string(backend), "-t", "mangle", "-N", "KUBE-IPTABLES-HINT"); err != nil {
		t.Fatal(err)
	}
	var log logBuffer
	cmd := exec.Command(proxierBinary(t), "--mode", m.mode, "--manifests", dir, "--hostname-override", "node-a", "--cluster-cidr", "10.128.0.0/10",
		"--healthz-bind-address", "", "--metrics-bind-address", "127.0.0.1:10249")
	cmd.Env = append(os.Environ(), "XTABLES_LOCKFILE="+lockFile)
	cmd.Stdout, cmd.Stderr = &log, &log
	started := time.Now()
	if err := ns.Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("proxier log:\n%s", log.String())
		}
	})
	get := nsGet(ns)
	metrics := func() map[string]float64 {
		t.Helper()
		m, err := scrape(get, "http://127.0.0.1:10249/metrics")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	const (
		full         = `kubeproxy_sync_full_proxy_rules_duration_seconds`
		partial      = `kubeproxy_sync_partial_proxy_rules_duration_seconds`
		programming  = `kubeproxy_network_programming_duration_seconds`
		ipv4         = `{ip_family="IPv4"}`
		countSuffix  = "_count" + ipv4
		sumSuffix    = "_sum" + ipv4
		fullSyncWait = 5 * time.Minute
	)
	eventually(t, fullSyncWait, "the first full sync", func() error {
		if _, _, err := get("http://127.0.0.1:10249/metrics"); err != nil {
			return err
		}
		if metrics()[full+countSuffix] < 1 {
			return fmt.Errorf("no full sync yet")
		}
		return nil
	})
	t.Logf("%s %dx%d: proxier start to first full sync %v; the full sync itself took %.2fs",
		m.name, services, endpoints, time.Since(started).Round(time.Millisecond), metrics()[full+sumSuffix])

	// Changes, each to another service in another file, after a pause
	// longer than --min-sync-period so that the runner may sync at once.
	const changes = 5
	var latencies, syncs []float64
	for c := range changes {
		time.Sleep(1500 * time.Millisecond)
		i := (c*services/changes + c) % services
		eps[i].Endpoints[1].Conditions.Ready = ptr.To(false)
		eps[i].Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: triggerPlaceholder}
		before := metrics()
		writeChunk(i / latencyServicesPerFile)
		delete(eps[i].Annotations, v1.EndpointsLastChangeTriggerTime)
		eventually(t, time.Minute, "the change's latency observed", func() error {
			if metrics()[programming+countSuffix] <= before[programming+countSuffix] {
				return fmt.Errorf("not yet")
			}
			return nil
		})
		after := metrics()
		if d := after[programming+countSuffix] - before[programming+countSuffix]; d != 1 {
			t.Errorf("change %d: %v latencies observed, want 1", c, d)
		}
		if after[full+countSuffix] != before[full+countSuffix] {
			t.Errorf("change %d made a full sync", c)
		}
		latencies = append(latencies, after[programming+sumSuffix]-before[programming+sumSuffix])
		syncs = append(syncs, (after[partial+sumSuffix]-before[partial+sumSuffix])/(after[partial+countSuffix]-before[partial+countSuffix]))
	}
	t.Logf("%s %dx%d: network programming latency %s; partial sync %s", m.name, services, endpoints, spreadOf(latencies), spreadOf(syncs))

	changed := eps[(services/changes+1)%services]
	if m.mode == modeNFTables {
		// A slice none of the changes above touched.
		bare := bareNFT(t, objs, changed, eps[services/(2*changes)])
		t.Logf("%s %dx%d: nft -f alone, same transactions: first full %v, partial (one endpoint) %v",
			m.name, services, endpoints, bare.full.Round(time.Millisecond), bare.partial.Round(10*time.Microsecond))
		if bare.elements > 0 {
			t.Logf("%s %dx%d: the same kind of change to another service and back (%d elements), %d times each: as one netlink batch %s; through nft -f %s",
				m.name, services, endpoints, bare.elements, len(bare.netlink), spreadOf(bare.netlink), spreadOf(bare.nftElements))
		}
		return
	}
	restoreFull, restorePartial := bareRestore(t, backend, objs, changed)
	t.Logf("%s %dx%d: iptables-restore alone, same rules: first full %v, partial (one endpoint) %v",
		m.name, services, endpoints, restoreFull.Round(time.Millisecond), restorePartial.Round(time.Millisecond))
}

// latencyTrackers returns trackers fed with objs, the slice named as
// changed as it was before the change.
func latencyTrackers(objs []runtime.Object, changed *discoveryv1.EndpointSlice) (*changetracker.ServiceChangeTracker, *changetracker.EndpointsChangeTracker) {
	quiet := changetracker.WithLogger(klog.Background().V(10))
	svcTracker := changetracker.NewServiceChangeTracker(v1.IPv4Protocol, nil, quiet)
	epTracker := changetracker.NewEndpointsChangeTracker(v1.IPv4Protocol, "node-a", nil, quiet)
	for _, o := range objs {
		switch o := o.(type) {
		case *v1.Service:
			svcTracker.Update(nil, o)
		case *discoveryv1.EndpointSlice:
			if o.Name == changed.Name {
				o = o.DeepCopy()
				o.Endpoints[1].Conditions.Ready = ptr.To(true)
			}
			epTracker.EndpointSliceUpdate(o, false)
		}
	}
	return svcTracker, epTracker
}

// bareTimes are bareNFT's figures.
type bareTimes struct {
	// full and partial are nft -f applying the first full transaction
	// and the partial one of the change (as a transaction, also when
	// the proxier sends it as a batch).
	full, partial time.Duration
	// netlink are the seconds ApplyElementBatch took to apply the batch
	// of the same kind of change to another service, as the proxier
	// sends it, and nftElements those nft -f took to undo it, given the
	// batch as a transaction, a few times in turn; elements counts the
	// elements of a batch (0: the change was not of elements alone, and
	// nothing was timed).
	netlink, nftElements []float64
	elements             int
}

// bareNFT is bareRestore in nftables mode: it times nft -f applying the
// first full transaction of objs and the partial one of the change, in a
// fresh namespace; then the same change to other (a slice as changed was
// before its change) and back, a few times, through netlink and through
// nft -f in turn, when it changes elements alone.
func bareNFT(t *testing.T, objs []runtime.Object, changed, other *discoveryv1.EndpointSlice) bareTimes {
	ctx := context.Background()
	svcTracker, epTracker := latencyTrackers(objs, changed)
	ns := kerneltest.NewNS(t)
	var nft knftables.Interface
	if err := ns.Do(func() (err error) {
		nft, err = knftables.New(knftables.IPv4Family, nftables.DefaultTableName)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var nodePorts []netip.Prefix
	for _, ip := range objsNodeIPs(objs) {
		nodePorts = append(nodePorts, netip.PrefixFrom(ip, ip.BitLen()))
	}
	w, err := nftables.NewWriter(nft, nftables.WriterConfig{
		Family:              v1.IPv4Protocol,
		Node:                proxy.NodeConfig{Name: "node-a", NodePortAddresses: nodePorts, ClusterCIDRs: []netip.Prefix{prefix("10.128.0.0/10")}},
		NetlinkElementSyncs: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	svcMap, epMap := changetracker.ServicePortMap{}, changetracker.EndpointsMap{}
	// apply times the sync's transaction through nft -f, or its batch
	// through netlink, or the batch as a transaction through nft -f when
	// asNFT.
	apply := func(wantFull, asNFT bool) (took time.Duration, elements int) {
		t.Helper()
		// In the namespace: a full sync may list the table first.
		err := ns.Do(func() error {
			res := w.Sync(ctx, &proxy.FamilyInput{Services: svcMap, Endpoints: epMap,
				ServiceChanges: svcMap.Update(svcTracker), EndpointChanges: epMap.Update(epTracker), NodeIPs: objsNodeIPs(objs)})
			if res.Full != wantFull || !wantFull && res.ServicePortsWritten != 1 {
				return fmt.Errorf("rendered a full=%v sync of %d service ports, want full=%v", res.Full, res.ServicePortsWritten, wantFull)
			}
			tx := res.Transaction
			if res.Batch != nil {
				elements = res.Batch.Len()
				if asNFT {
					tx = nft.NewTransaction()
					res.Batch.AddTo(tx)
				}
			}
			start := time.Now()
			var err error
			if res.Batch != nil && !asNFT {
				err = nftables.ApplyElementBatch(*res.Batch)
			} else {
				err = nft.Run(ctx, tx)
			}
			took = time.Since(start)
			w.Applied(err)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return took, elements
	}
	var out bareTimes
	out.full, _ = apply(true, false)
	epTracker.EndpointSliceUpdate(changed, false)
	out.partial, _ = apply(false, true)
	// The shared chains of the new endpoint count exist now, if they
	// did not before.
	edited := other.DeepCopy()
	edited.Endpoints[1].Conditions.Ready = ptr.To(false)
	for range 5 {
		epTracker.EndpointSliceUpdate(edited, false)
		took, n := apply(false, false)
		if n == 0 {
			return out
		}
		out.netlink, out.elements = append(out.netlink, took.Seconds()), n
		epTracker.EndpointSliceUpdate(other, false)
		took, _ = apply(false, true)
		out.nftElements = append(out.nftElements, took.Seconds())
	}
	return out
}

// spreadOf prints the median and range of seconds as milliseconds.
func spreadOf(secs []float64) string {
	s := slices.Clone(secs)
	slices.Sort(s)
	ms := func(v float64) string { return fmt.Sprintf("%.1fms", v*1000) }
	return fmt.Sprintf("median %s (min %s, max %s, n=%d)", ms(s[len(s)/2]), ms(s[0]), ms(s[len(s)-1]), len(s))
}

// bareRestore renders, with a writer in the test configured as the
// proxier configures its own, the first full sync of objs and the partial
// sync of the change the proxier saw (changed, already edited), and times
// RestoreAll applying each in a fresh namespace, with nothing else around.
func bareRestore(t *testing.T, backend iptables.Backend, objs []runtime.Object, changed *discoveryv1.EndpointSlice) (full, partial time.Duration) {
	ctx := context.Background()
	svcTracker, epTracker := latencyTrackers(objs, changed)
	cfg := iptables.WriterConfig{
		Family:      v1.IPv4Protocol,
		Node:        proxy.NodeConfig{Name: "node-a", ClusterCIDRs: []netip.Prefix{prefix("10.128.0.0/10")}},
		RandomFully: true,
	}
	if backend == iptables.BackendNFT {
		cfg.ChainsPerCommit = iptables.NFTChainsPerCommit
	}
	w, err := iptables.NewWriter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	svcMap, epMap := changetracker.ServicePortMap{}, changetracker.EndpointsMap{}
	sync := func() iptables.SyncResult {
		return w.Sync(ctx, &proxy.FamilyInput{Services: svcMap, Endpoints: epMap,
			ServiceChanges: svcMap.Update(svcTracker), EndpointChanges: epMap.Update(epTracker), NodeIPs: objsNodeIPs(objs)})
	}
	ns := kerneltest.NewNS(t)
	ipt, err := iptables.New(ctx, v1.IPv4Protocol, iptables.WithBackend(backend), iptables.WithLockFile(filepath.Join(t.TempDir(), "xtables.lock")))
	if err != nil {
		t.Fatal(err)
	}
	restore := func(res iptables.SyncResult) time.Duration {
		t.Helper()
		var took time.Duration
		err := ns.Do(func() error {
			if res.Full {
				if err := w.EnsureJumpRules(ctx, ipt); err != nil {
					return err
				}
			}
			// The lock is this namespace's own, so the restore never
			// waits for it.
			start := time.Now()
			err := ipt.RestoreAll(ctx, res.Payload, iptables.NoFlushTables, iptables.RestoreCounters)
			took = time.Since(start)
			return err
		})
		w.Applied(err)
		if err != nil {
			t.Fatal(err)
		}
		return took
	}
	full = restore(sync())
	epTracker.EndpointSliceUpdate(changed, false)
	res := sync()
	if res.Full || res.ServicePortsWritten != 1 {
		t.Fatalf("the change rendered a full=%v sync of %d service ports, want a partial one of 1", res.Full, res.ServicePortsWritten)
	}
	return full, restore(res)
}

func objsNodeIPs(objs []runtime.Object) []netip.Addr {
	for _, o := range objs {
		if n, ok := o.(*v1.Node); ok {
			var out []netip.Addr
			for _, a := range n.Status.Addresses {
				out = append(out, netip.MustParseAddr(a.Address))
			}
			return out
		}
	}
	return nil
}
