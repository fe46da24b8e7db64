package nftables

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/proxy"
)

// fakeNFTScript is an nft for knftables.New that passes its checks,
// answers listings as for a missing table, and takes transactions; while
// the file "hang" is in its directory it records its process ID in
// "pids" and hangs instead of taking a transaction.
const fakeNFTScript = `#!/bin/sh
dir=$(dirname "$0")
case "$1" in
--version) echo "nftables v1.0.6 (Lester Gooch #5)"; exit 0 ;;
--check) cat >/dev/null; exit 0 ;;
--json) echo "Error: No such file or directory" >&2; exit 1 ;;
esac
if [ -e "$dir/hang" ]; then
	echo $$ >>"$dir/pids"
	exec sleep 1000
fi
cat >/dev/null
`

// TestSyncTimesOutHungNFT runs a Mode over the real knftables and an
// nft that hangs on a partial sync's transaction: the sync must fail
// within a generous bound with an error IsCommandTimeout
// recognises, the hung nft must be gone, and the next sync, with nft
// answering again, must be full.
func TestSyncTimesOutHungNFT(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "nft"), []byte(fakeNFTScript), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	nft, err := knftables.New(knftables.IPv4Family, DefaultTableName)
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	// Long enough for a loaded machine to run the fake nft in time.
	const timeout = 3 * time.Second
	b, err := NewMode(ctx, WriterConfig{Family: v1.IPv4Protocol, Node: proxy.NodeConfig{Name: "node-a"}}, nft,
		WithCommandTimeout(timeout), WithTableLookup(func(context.Context) (bool, error) { return true, nil }), withoutNetlink())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	f := familyOf(b, nil, nil)
	f.addService("web", "10.96.0.10", "10.244.0.11")
	if full, err := f.sync(t); err != nil || !full {
		t.Fatalf("first sync: full=%v, error %v; want a full sync that succeeds", full, err)
	}

	f.addService("db", "10.96.0.11", "10.244.0.12")
	if err := os.WriteFile(filepath.Join(dir, "hang"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := f.sync(t)
		done <- err
	}()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatal("the sync still waits for the hung nft")
	}
	if !IsCommandTimeout(err) || !strings.Contains(err.Error(), "timed out after "+timeout.String()) {
		t.Fatalf("sync with a hung nft: error %v, want a timeout that names its bound", err)
	}
	pids, err := os.ReadFile(filepath.Join(dir, "pids"))
	if err != nil {
		t.Fatalf("the hung nft did not run: %v", err)
	}
	for _, line := range strings.Fields(string(pids)) {
		pid, err := strconv.Atoi(line)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("the hung nft, process %d, is still there after the sync returned (kill -0: %v)", pid, err)
		}
	}

	if err := os.Remove(filepath.Join(dir, "hang")); err != nil {
		t.Fatal(err)
	}
	if full, err := f.sync(t); err != nil || !full {
		t.Errorf("sync after the timeout: full=%v, error %v; want a full sync that succeeds", full, err)
	}
}

// TestCommandTimeoutOption checks the bound the Mode gives its nft
// commands and netlink requests: DefaultCommandTimeout, the
// option's, or none.
func TestCommandTimeoutOption(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []ModeOption
		want Netlink
	}{
		{name: "default", want: Netlink{Timeout: DefaultCommandTimeout}},
		{name: "set", opts: []ModeOption{WithCommandTimeout(time.Minute)}, want: Netlink{Timeout: time.Minute}},
		{name: "none", opts: []ModeOption{WithCommandTimeout(0)}, want: Netlink{Timeout: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			fake := knftables.NewFake(knftables.IPv4Family, DefaultTableName)
			b, err := NewMode(ctx, WriterConfig{Family: v1.IPv4Protocol}, fake,
				append(tc.opts, WithTableLookup(tableExists(fake)))...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			if got := b.netlink(); got != tc.want {
				t.Errorf("netlink requests bounded as %+v, want %+v", got, tc.want)
			}
			if unbounded := b.nft == knftables.Interface(fake); unbounded != (tc.want.Timeout < 0) {
				t.Errorf("nft commands unbounded: %v, want %v", unbounded, tc.want.Timeout < 0)
			}
		})
	}
}
