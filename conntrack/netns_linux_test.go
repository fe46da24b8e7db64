package conntrack_test

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
)

// TestKernel_WithNetNSPath checks that New works on the table of the
// namespace WithNetNSPath names, in both of its forms, and on the calling
// thread's with "": each of two namespaces holds one flow, inserted with the
// conntrack tool, and each Interface must list exactly its namespace's.
func TestKernel_WithNetNSPath(t *testing.T) {
	kerneltest.Require(t, "conntrack", "ip")
	_, ctx := ktesting.NewTestContext(t)
	a, b := kerneltest.NewNS(t), kerneltest.NewNS(t)
	flowA := udp("10.0.0.2:40001", "10.96.0.10:53", "10.0.1.2:5353")
	flowB := udp("10.0.0.3:40002", "10.96.0.11:53", "10.0.2.2:5353")
	insertFlow(t, a, flowA)
	insertFlow(t, b, flowB)

	// A process in b, for the /proc/PID/ns/net form.
	sleeper := exec.Command("ip", "netns", "exec", b.Name, "sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sleeper.Process.Kill()
		_ = sleeper.Wait()
	})
	// ip netns exec enters b after it starts: wait until the process is
	// there, or the first case races it.
	procNS := fmt.Sprintf("/proc/%d/ns/net", sleeper.Process.Pid)
	for deadline := time.Now().Add(10 * time.Second); !sameFile(procNS, nsPath(b)); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s never entered namespace %s", procNS, b.Name)
		}
	}

	for _, tc := range []struct {
		name string
		path string
		// inA runs the calls on a thread inside a, for "".
		inA     bool
		want    []conntrack.Flow
		wantErr string
	}{
		{name: "bind-mounted namespace a", path: nsPath(a), want: []conntrack.Flow{flowA}},
		{name: "bind-mounted namespace b", path: nsPath(b), want: []conntrack.Flow{flowB}},
		{name: "a process's namespace", path: fmt.Sprintf("/proc/%d/ns/net", sleeper.Process.Pid), want: []conntrack.Flow{flowB}},
		{name: "empty: the calling thread's", path: "", inA: true, want: []conntrack.Flow{flowA}},
		{name: "missing namespace", path: nsPath(a) + "-missing", wantErr: nsPath(a) + "-missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []conntrack.Flow
			var err error
			list := func() error {
				got, err = conntrack.New(conntrack.WithNetNSPath(tc.path)).ListFlows(ctx, v1.IPv4Protocol)
				return nil
			}
			run := func(fn func() error) error { return fn() }
			if tc.inA {
				run = a.Do
			}
			if doErr := run(list); doErr != nil {
				t.Fatal(doErr)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ListFlows = %v, %v; want an error naming %s", lines(got), err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got = slices.DeleteFunc(got, func(f conntrack.Flow) bool { return f.Protocol != conntrack.ProtocolUDP })
			if diff := cmp.Diff(lines(tc.want), lines(got)); diff != "" {
				t.Errorf("flows (-want +got):\n%s", diff)
			}
		})
	}

	// Deleting goes to the named namespace too: b's flow, deleted through
	// b's path, is gone from b and a's flow is untouched.
	if n, err := conntrack.New(conntrack.WithNetNSPath(nsPath(b))).DeleteFlows(ctx, v1.IPv4Protocol, []conntrack.Flow{flowA, flowB}); err != nil || n != 1 {
		t.Errorf("DeleteFlows in b = %d, %v; want 1, nil", n, err)
	}
	if out := b.MustExec(t, "conntrack", "-L", "-p", "udp"); strings.Contains(out, "10.96.0.11") {
		t.Errorf("b still holds its flow:\n%s", out)
	}
	if out := a.MustExec(t, "conntrack", "-L", "-p", "udp"); !strings.Contains(out, "10.96.0.10") {
		t.Errorf("a lost its flow:\n%s", out)
	}
}

// sameFile reports whether paths a and b name the same file (for
// namespaces: the same namespace).
func sameFile(a, b string) bool {
	sa, errA := os.Stat(a)
	sb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(sa, sb)
}

// insertFlow adds f to ns's conntrack table with the conntrack tool.
func insertFlow(t *testing.T, ns *kerneltest.NS, f conntrack.Flow) {
	t.Helper()
	ns.MustExec(t, "conntrack", "-I", "-p", f.Protocol.String(), "-t", "600",
		"-s", f.Original.Src.String(), "-d", f.Original.Dst.String(),
		"--sport", fmt.Sprint(f.Original.SrcPort), "--dport", fmt.Sprint(f.Original.DstPort),
		"-r", f.Reply.Src.String(), "-q", f.Reply.Dst.String(),
		"--reply-port-src", fmt.Sprint(f.Reply.SrcPort), "--reply-port-dst", fmt.Sprint(f.Reply.DstPort))
}
