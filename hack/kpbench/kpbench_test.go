package main

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/knftables"
)

func TestMain(m *testing.M) {
	// The driver runs the test binary itself as its children.
	if os.Getenv(childEnv) != "" {
		os.Exit(childMain(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// TestDriveSmall runs the whole benchmark at a tiny size: kube-proxy's and
// proxykit's children in turn, in both modes, through every step. What each
// side hands the kernel tool shows that its syncs ran and were of the kind
// the step asks for.
func TestDriveSmall(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	results, err := drive(driverConfig{scales: []scale{{50, 2}}, modes: []string{"iptables", "nftables"}, count: 1, reps: 2, exe: exe, log: logWriter{t}})
	if err != nil {
		t.Fatal(err)
	}

	// Whether each side sent anything, by side, mode and step.
	got := map[string]bool{}
	for _, r := range results {
		if r.Services != 50 || r.Endpoints != 2 {
			t.Errorf("%s %s ran %dx%d, want 50x2", r.Side, r.Mode, r.Services, r.Endpoints)
		}
		var names []string
		for _, st := range r.Steps {
			names = append(names, st.Step)
			if st.CPU <= 0 || st.Ops < 1 {
				t.Errorf("%s %s %s: CPU %v over %d operations", r.Side, r.Mode, st.Step, st.CPU, st.Ops)
			}
			got[fmt.Sprintf("%s %s %s", r.Side, r.Mode, st.Step)] = st.Bytes > 0
		}
		if diff := cmp.Diff(steps, names); diff != "" {
			t.Errorf("%s %s steps (-want +got):\n%s", r.Side, r.Mode, diff)
		}
		if r.PeakHeap == 0 || r.PeakRSS == 0 {
			t.Errorf("%s %s: peak heap %d, peak RSS %d", r.Side, r.Mode, r.PeakHeap, r.PeakRSS)
		}
	}
	want := map[string]bool{}
	for _, side := range []string{"kp", "pk"} {
		for _, mode := range []string{"iptables", "nftables"} {
			for _, st := range steps {
				want[fmt.Sprintf("%s %s %s", side, mode, st)] = true
			}
		}
	}
	// Nothing changed, nothing to send; but kube-proxy's iptables mode
	// rewrites its top-level chains on every sync.
	want["pk iptables unchanged resync"] = false
	want["pk nftables unchanged resync"] = false
	want["kp nftables unchanged resync"] = false
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sent anything (-want +got):\n%s", diff)
	}

	rows := strings.Split(strings.TrimSpace(table(results)), "\n")
	if n := 2 + 2*(len(steps)+3); len(rows) != n {
		t.Errorf("table has %d lines, want %d:\n%s", len(rows), n, strings.Join(rows, "\n"))
	}
}

// TestNFTRecorderList checks the stand-in kernel's answers to List and
// ListElements, which decide what kube-proxy's syncs delete and which
// elements they rewrite: what the transactions so far left, and not found
// before the table exists and after it is deleted.
func TestNFTRecorderList(t *testing.T) {
	ctx := context.Background()
	r := newNFTRecorder()
	if _, err := r.List(ctx, "chain"); !knftables.IsNotFound(err) {
		t.Fatalf("List before any transaction: %v, want not found", err)
	}
	tx := r.NewTransaction()
	tx.Add(&knftables.Table{})
	for i := range 3000 {
		tx.Add(&knftables.Chain{Name: fmt.Sprintf("endpoint-%d", i)})
	}
	tx.Add(&knftables.Set{Name: "affinity-a", Type: "ipv4_addr"})
	tx.Add(&knftables.Map{Name: "service-ips", Type: "ipv4_addr . inet_proto . inet_service : verdict"})
	for i := range 1000 {
		tx.Add(&knftables.Element{Map: "service-ips", Key: []string{fmt.Sprintf("10.0.%d.%d", i/250, i%250), "tcp", "80"}, Comment: ptr.To("ns/svc"), Value: []string{fmt.Sprintf("goto service-%d", i)}})
	}
	if err := r.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	tx = r.NewTransaction()
	for i := 1; i < 3000; i++ {
		tx.Delete(&knftables.Chain{Name: fmt.Sprintf("endpoint-%d", i)})
	}
	tx.Add(&knftables.Chain{Name: "service-x"})
	for i := 1; i < 1000; i++ {
		tx.Delete(&knftables.Element{Map: "service-ips", Key: []string{fmt.Sprintf("10.0.%d.%d", i/250, i%250), "tcp", "80"}})
	}
	// A new value for the one left.
	tx.Delete(&knftables.Element{Map: "service-ips", Key: []string{"10.0.0.0", "tcp", "80"}})
	tx.Add(&knftables.Element{Map: "service-ips", Key: []string{"10.0.0.0", "tcp", "80"}, Value: []string{"goto service-x"}})
	if err := r.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	chains, err := r.List(ctx, "chains")
	if err != nil {
		t.Fatal(err)
	}
	sets, err := r.List(ctx, "set")
	if err != nil {
		t.Fatal(err)
	}
	elems, err := r.ListElements(ctx, "map", "service-ips")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(chains)
	if diff := cmp.Diff([]string{"endpoint-0", "service-x"}, chains); diff != "" {
		t.Errorf("chains (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"affinity-a"}, sets); diff != "" {
		t.Errorf("sets (-want +got):\n%s", diff)
	}
	want := []*knftables.Element{{Map: "service-ips", Key: []string{"10.0.0.0", "tcp", "80"}, Value: []string{"goto service-x"}}}
	if diff := cmp.Diff(want, elems); diff != "" {
		t.Errorf("elements (-want +got):\n%s", diff)
	}

	tx = r.NewTransaction()
	tx.Flush(&knftables.Map{Name: "service-ips"})
	if err := r.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if elems, err := r.ListElements(ctx, "map", "service-ips"); err != nil || len(elems) != 0 {
		t.Errorf("elements after a flush: %v, %v; want none", elems, err)
	}
	tx = r.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := r.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if _, err := r.List(ctx, "chain"); !knftables.IsNotFound(err) {
		t.Errorf("List after the table's deletion: %v, want not found", err)
	}
	if _, err := r.ListElements(ctx, "map", "service-ips"); !knftables.IsNotFound(err) {
		t.Errorf("ListElements after the table's deletion: %v, want not found", err)
	}
	if r.bytes == 0 || r.failed != 0 {
		t.Errorf("recorded %d bytes and %d failures, want some bytes and no failure", r.bytes, r.failed)
	}
}

// TestChildProfiles runs one child with the profile flags and checks that
// each file is a profile of the kind asked for, and that the allocation
// profile holds the first sync's allocations and its base does not.
func TestChildProfiles(t *testing.T) {
	dir := t.TempDir()
	cpu, mem := dir+"/first.cpu", dir+"/first.mem"
	var stdout, stderr strings.Builder
	if rc := childMain([]string{"-side", "pk", "-mode", "iptables", "-services", "300", "-endpoints", "10", "-reps", "1", "-cpuprofile", cpu, "-memprofile", mem}, &stdout, &stderr); rc != 0 {
		t.Fatalf("child exited %d: %s", rc, stderr.String())
	}
	// A profile is a gzipped protocol buffer whose string table names its
	// sample types and its functions.
	for _, tc := range []struct {
		file string
		want []string
		not  []string
	}{
		{file: cpu, want: []string{"cpu", "iptables.(*Writer).Sync"}},
		{file: mem, want: []string{"alloc_space", "iptables.growBuffer"}},
		{file: mem + ".base", want: []string{"alloc_space"}, not: []string{"iptables.growBuffer"}},
	} {
		text := profileText(t, tc.file)
		for _, w := range tc.want {
			if !strings.Contains(text, w) {
				t.Errorf("%s does not name %q", tc.file, w)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(text, n) {
				t.Errorf("%s names %q", tc.file, n)
			}
		}
	}
}

func profileText(t *testing.T, file string) string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	b, err := io.ReadAll(z)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return string(b)
}
