package iptables_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
)

// The second proxy's Service in TestTwoWritersKernel, on pod-c.
const (
	otherSvcIP    = "10.96.1.10"
	otherNodePort = 30999
)

// TestTwoWritersKernel runs two writers in one node namespace, as two
// proxies serving different Services (KEP-2447) would: kube-proxy's names
// for the scenarios' Services, PROXYB for another one. Each proxy's
// Services are reachable with real packets, each one's full sync and
// cleanup leave the other's rules and traffic as they were.
func TestTwoWritersKernel(t *testing.T) {
	for _, backend := range []iptables.Backend{iptables.BackendLegacy, iptables.BackendNFT} {
		t.Run(string(backend), func(t *testing.T) {
			kerneltest.Require(t, kernelTools(backend)...)
			testTwoWritersKernel(t, backend)
		})
	}
}

func testTwoWritersKernel(t *testing.T, backend iptables.Backend) {
	ctx := context.Background()
	k := newKernelNode(t, backend)
	names := mustNames(t, otherPrefix)
	cfg := scnWriterConfig(k.ipt.HasRandomFully())
	cfg.ChainPrefix = otherPrefix
	ow := mustWriter(t, cfg)
	oc := newCluster(v1.IPv4Protocol, scnNode)
	oc.setService(makeService("other", "db", otherSvcIP, withNodePort(otherNodePort)))
	oc.setEndpoints("other", "db", tcp8080, scnEP(scnPodC))

	// otherSync syncs the second writer into the kernel and the Fake.
	otherSync := func(t *testing.T) {
		t.Helper()
		res := ow.Sync(ctx, oc.input())
		err := k.node.Do(func() error {
			if res.Full {
				if err := ow.EnsureJumpRules(ctx, k.ipt); err != nil {
					return err
				}
			}
			return k.ipt.RestoreAll(ctx, res.Payload, iptables.NoFlushTables, iptables.RestoreCounters)
		})
		ow.Applied(err)
		if err != nil {
			t.Fatalf("%s %s sync: %v\n%s", otherPrefix, syncKind(res), err, res.Payload)
		}
		if res.Full {
			if err := ow.EnsureJumpRules(ctx, k.fake); err != nil {
				t.Fatal(err)
			}
		}
		if err := k.fake.RestoreAll(ctx, res.Payload, iptables.NoFlushTables, iptables.RestoreCounters); err != nil {
			t.Fatalf("Fake refused what the kernel took: %v", err)
		}
	}
	// rulesOf returns the kernel's lines of both tables that name prefix.
	rulesOf := func(t *testing.T, prefix string) []string {
		t.Helper()
		save := string(stripCounters(append(k.save(t, iptables.TableFilter), k.save(t, iptables.TableNAT)...)))
		return iptablestest.PrefixLines(save, prefix)
	}
	reachable := func(t *testing.T) {
		t.Helper()
		k.expectBalanced(t, "tcp", scnWebIP, 80, 40, "pod-a", "pod-b")
		k.expectBalanced(t, "tcp", scnNodeIP, scnNodePort, 40, "pod-a", "pod-b")
		k.expectOnly(t, "tcp", otherSvcIP, 80, 10, "pod-c")
		k.expectOnly(t, "tcp", scnNodeIP, otherNodePort, 10, "pod-c")
	}

	k.sync(t)
	otherSync(t)
	k.checkChains(t)
	reachable(t)

	t.Run("KUBE syncs leave PROXYB alone", func(t *testing.T) {
		before := rulesOf(t, otherPrefix)
		if len(before) < 10 {
			t.Fatalf("only %d lines of %s's in the kernel", len(before), otherPrefix)
		}
		k.w.RequestFullSync()
		if res := k.sync(t); !res.Full {
			t.Fatal("sync was not full")
		}
		scnRemoveEndpoint(k.c)
		k.sync(t)
		if diff := cmp.Diff(before, rulesOf(t, otherPrefix)); diff != "" {
			t.Errorf("%s's rules changed (-before +after):\n%s", otherPrefix, diff)
		}
		k.checkChains(t)
		k.expectOnly(t, "tcp", scnWebIP, 80, 10, "pod-a")
		k.expectOnly(t, "tcp", otherSvcIP, 80, 10, "pod-c")
		k.expectOnly(t, "tcp", scnNodeIP, otherNodePort, 10, "pod-c")
	})

	t.Run("PROXYB syncs and cleanup leave KUBE alone", func(t *testing.T) {
		before := rulesOf(t, "KUBE")
		ow.RequestFullSync()
		otherSync(t)
		oc.setEndpoints("other", "db", tcp8080, scnEP(scnPodC), scnEP(scnPodD))
		otherSync(t)
		k.expectBalanced(t, "tcp", otherSvcIP, 80, 40, "pod-c", "pod-d")
		k.checkChains(t)

		var n int
		if err := k.node.Do(func() (err error) {
			n, err = names.Cleanup(ctx, k.ipt)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Error("cleanup deleted nothing")
		}
		if left := rulesOf(t, otherPrefix); len(left) > 0 {
			t.Errorf("cleanup left %s's rules:\n%s", otherPrefix, strings.Join(left, ""))
		}
		if diff := cmp.Diff(before, rulesOf(t, "KUBE")); diff != "" {
			t.Errorf("KUBE's rules changed (-before +after):\n%s", diff)
		}
		k.expectOnly(t, "tcp", scnWebIP, 80, 10, "pod-a")
		k.expectBalanced(t, "tcp", scnNodeIP, scnNodePort, 40, "pod-a", "pod-b")
		if r, err := k.dial("tcp", scnClientIP, otherSvcIP, 80, 500*time.Millisecond); err == nil {
			t.Errorf("%s's cluster IP still reaches %s after its cleanup", otherPrefix, r.Name)
		}
	})
}
