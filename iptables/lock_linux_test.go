package iptables

import (
	"context"
	"errors"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestRestoreTakesLockForOldVersions checks that for an iptables-restore
// that cannot wait for the xtables lock (before 1.6.2), the lock file is
// held while it runs, and that a held lock times out with IsLockTimeout.
func TestRestoreTakesLockForOldVersions(t *testing.T) {
	lockFile := t.TempDir() + "/xtables.lock"
	heldDuringRestore := false
	r, e := newTestRunner(t, BackendLegacy, v1.IPv4Protocol, "iptables v1.6.1", func(name string, args []string, stdin string) result {
		f, err := os.OpenFile(lockFile, os.O_RDWR, 0)
		if err != nil {
			t.Errorf("opening the lock file: %v", err)
			return result{}
		}
		defer f.Close()
		heldDuringRestore = errors.Is(unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB), unix.EWOULDBLOCK)
		return result{}
	})
	r.lockFile = lockFile
	if err := r.RestoreAll(context.Background(), []byte("*filter\nCOMMIT\n"), NoFlushTables, NoRestoreCounters); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"iptables-legacy-restore --noflush"}, e.commands()); diff != "" {
		t.Errorf("commands (-want +got):\n%s", diff)
	}
	if !heldDuringRestore {
		t.Error("the xtables lock was not held while iptables-restore ran")
	}

	// Now someone else holds it: the restore gives up after lockWait,
	// on the runner's clock.
	other, err := os.OpenFile(lockFile, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := unix.Flock(int(other.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	clock := clocktesting.NewFakeClock(time.Now())
	r.clock = clock
	done := make(chan error)
	go func() { done <- r.RestoreAll(context.Background(), nil, NoFlushTables, NoRestoreCounters) }()
	for {
		select {
		case err := <-done:
			if !IsLockTimeout(err) {
				t.Fatalf("restore with the lock held elsewhere: got %v, want a lock timeout", err)
			}
			if len(e.commands()) != 1 {
				t.Errorf("iptables-restore ran without the lock: %v", e.commands())
			}
			return
		default:
			if clock.HasWaiters() {
				clock.Step(lockRetryInterval)
			}
			runtime.Gosched()
		}
	}
}
