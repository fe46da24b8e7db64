package iptables

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/utils/clock"
)

// lockRetryInterval is how often grabXtablesLock retries, as iptables' own
// -W default.
const lockRetryInterval = 100 * time.Millisecond

// grabXtablesLock takes the xtables lock the way an iptables binary that
// cannot wait for it would: an exclusive flock on path (iptables 1.6.0 and
// later, file true) or the abstract unix socket "@xtables" (earlier
// versions). It retries until wait has passed on clk or ctx ends, and
// returns the function that releases the lock.
func grabXtablesLock(ctx context.Context, clk clock.Clock, path string, file bool, wait time.Duration) (func(), error) {
	deadline := clk.Now().Add(wait)
	var try func() (func(), bool, error)
	if file {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, fmt.Errorf("opening the xtables lock: %w", err)
		}
		try = func() (func(), bool, error) {
			err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			switch {
			case err == nil:
				return func() { f.Close() }, true, nil
			case errors.Is(err, unix.EWOULDBLOCK):
				return nil, false, nil
			}
			return nil, false, fmt.Errorf("locking %s: %w", path, err)
		}
		defer func() {
			if try != nil {
				f.Close()
			}
		}()
	} else {
		path = "@xtables"
		try = func() (func(), bool, error) {
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
			switch {
			case err == nil:
				return func() { l.Close() }, true, nil
			case errors.Is(err, unix.EADDRINUSE):
				return nil, false, nil
			}
			return nil, false, fmt.Errorf("binding %s: %w", path, err)
		}
	}
	for {
		release, ok, err := try()
		if err != nil {
			return nil, err
		}
		if ok {
			try = nil
			return release, nil
		}
		if !clk.Now().Before(deadline) {
			return nil, fmt.Errorf("%s held by another program for %v: %w", path, wait, errLockTimeout)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for %s: %w", path, ctx.Err())
		case <-clk.After(lockRetryInterval):
		}
	}
}
