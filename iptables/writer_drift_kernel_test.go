package iptables_test

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/proxy"
)

// TestWriterCheckDriftKernel loads the benchmark clusters into a
// throwaway namespace with the real iptables-restore of each backend and
// checks Writer.CheckDrift against the real "iptables -S": it must find
// nothing in the rules as applied (the kernel prints rules differently from
// how the writer wrote them, and a false alarm would make every check
// period a full sync), and the rule deleted by hand. It logs what
// a check costs (go test -v), and, for comparison, what reading the two
// tables with iptables-save costs. Only 1000x10 runs unless
// PROXYKIT_RESTORE_BENCH=1, which adds 10000x10; nothing runs with -short.
func TestWriterCheckDriftKernel(t *testing.T) {
	forKernelBenchSizes(t, benchSizes[:2], testCheckDriftKernel)
}

// forKernelBenchSizes runs fn on each backend for the first benchmark
// size, or for every one of sizes when PROXYKIT_RESTORE_BENCH=1; nothing
// runs with -short.
func forKernelBenchSizes(t *testing.T, sizes []benchSize, fn func(t *testing.T, backend iptables.Backend, size benchSize)) {
	if testing.Short() {
		t.Skip("skipping kernel timings in -short mode")
	}
	if os.Getenv(restoreBenchEnv) != "1" {
		sizes = sizes[:1]
	}
	for _, backend := range []iptables.Backend{iptables.BackendLegacy, iptables.BackendNFT} {
		for _, size := range sizes {
			t.Run(string(backend)+"/"+size.String(), func(t *testing.T) {
				kerneltest.Require(t, kernelTools(backend)...)
				fn(t, backend, size)
			})
		}
	}
}

func testCheckDriftKernel(t *testing.T, backend iptables.Backend, size benchSize) {
	ctx := context.Background()
	ns := kerneltest.NewNS(t)
	ipt := newNSIPT(t, ns, backend, v1.IPv4Protocol)
	cfg := iptables.WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-1", ClusterCIDRs: []netip.Prefix{prefix("10.128.0.0/10")}}, RandomFully: ipt.ipt.HasRandomFully()}
	if backend == iptables.BackendNFT {
		cfg.ChainsPerCommit = iptables.NFTChainsPerCommit
	}
	w := mustWriter(t, cfg)
	c := benchCluster(size)
	// Services without endpoints and with node ports, so that the
	// filter chains and nat KUBE-NODEPORTS hold rules too.
	for i := range 10 {
		name := fmt.Sprintf("np-%d", i)
		c.setService(makeService("bench", name, fmt.Sprintf("10.97.0.%d", i+1), withNodePort(int32(30000+i))))
		if i%2 == 0 {
			c.setEndpoints("bench", name, tcp8080, ep{IP: fmt.Sprintf("10.200.0.%d", i+1), Node: "node-1"})
		}
	}
	res := w.Sync(ctx, c.input())
	ipt.must(func(i iptables.Interface) error {
		if err := w.EnsureJumpRules(ctx, i); err != nil {
			return err
		}
		// iptables-restore without -w, as TestWriterRestoreTime runs it:
		// the namespace's tables are private.
		cmd := exec.Command("iptables-"+string(backend)+"-restore", "--noflush", "--counters")
		cmd.Stdin = bytes.NewReader(res.Payload)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	})
	w.Applied(nil)

	check := func() (iptables.Drift, time.Duration) {
		t.Helper()
		var d iptables.Drift
		var took time.Duration
		ipt.must(func(i iptables.Interface) (err error) {
			start := time.Now()
			d, err = w.CheckDrift(ctx, i)
			took = time.Since(start)
			return err
		})
		return d, took
	}
	for range 3 {
		d, took := check()
		if d.Found() {
			t.Fatalf("drift in the rules as applied: %+v", d)
		}
		t.Logf("%s %s: CheckDrift took %v", backend, size, took.Round(time.Millisecond))
	}
	for _, table := range []iptables.Table{iptables.TableNAT, iptables.TableFilter} {
		var buf bytes.Buffer
		start := time.Now()
		ipt.must(func(i iptables.Interface) error { return i.SaveInto(ctx, table, &buf) })
		t.Logf("%s %s: for comparison, iptables-save -t %s took %v (%d bytes)", backend, size, table, time.Since(start).Round(time.Millisecond), buf.Len())
	}

	// A service's jump and chain deleted by hand, and a node port's
	// reject rule.
	svc1 := kubeChains.ServiceCluster(portName("bench", "svc-1", "p", v1.ProtocolTCP))
	var buf bytes.Buffer
	ipt.must(func(i iptables.Interface) error {
		return i.ListRules(ctx, iptables.TableNAT, iptables.KubeServicesChain, &buf)
	})
	var jump []string
	for line := range strings.Lines(buf.String()) {
		if strings.HasSuffix(strings.TrimSpace(line), "-j "+string(svc1)) {
			jump = strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "-A KUBE-SERVICES "))
		}
	}
	if jump == nil {
		t.Fatalf("no jump to %s in KUBE-SERVICES", svc1)
	}
	ipt.must(func(i iptables.Interface) error {
		if err := i.DeleteRule(ctx, iptables.TableNAT, iptables.KubeServicesChain, unquote(jump)...); err != nil {
			return err
		}
		if err := i.FlushChain(ctx, iptables.TableNAT, svc1); err != nil {
			return err
		}
		return i.DeleteChain(ctx, iptables.TableNAT, svc1)
	})
	// The chain's own rules count as missing too when this check reads
	// it: always on legacy, in one check of several on nft.
	d, _ := check()
	if d.Missing < 1 || d.Unexpected != 0 || !slicesContainPrefix(d.Examples, `missing nat KUBE-SERVICES: "bench/svc-1:p cluster IP" -j `+string(svc1)) {
		t.Errorf("after deleting the jump to %s: drift %+v, want that rule missing", svc1, d)
	}
	res = w.Sync(ctx, c.input())
	if !res.Full {
		t.Error("the sync after the drift is partial")
	}
}

// unquote drops the double quotes of words as iptables -S prints them,
// joining a quoted comment back into one argument.
func unquote(words []string) []string {
	var out []string
	for i := 0; i < len(words); i++ {
		w := words[i]
		if !strings.HasPrefix(w, `"`) {
			out = append(out, w)
			continue
		}
		for !strings.HasSuffix(w, `"`) || len(w) == 1 {
			i++
			w += " " + words[i]
		}
		out = append(out, strings.Trim(w, `"`))
	}
	return out
}
