package iptables

import (
	"context"
	"errors"
	"fmt"
	"io"
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
// returns the lock; closing it releases the lock.
func grabXtablesLock(ctx context.Context, clk clock.Clock, path string, file bool, wait time.Duration) (io.Closer, error) {
	var try func() (io.Closer, error)
	if file {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, fmt.Errorf("opening the xtables lock: %w", err)
		}
		try = func() (io.Closer, error) {
			if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
				return nil, err
			}
			return f, nil
		}
		lock, err := retryLock(ctx, clk, path, wait, try)
		if err != nil {
			f.Close()
		}
		return lock, err
	}
	path = "@xtables"
	try = func() (io.Closer, error) {
		return net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	}
	return retryLock(ctx, clk, path, wait, try)
}

// retryLock calls try until it succeeds, fails otherwise than with "busy",
// wait has passed or ctx ends.
func retryLock(ctx context.Context, clk clock.Clock, path string, wait time.Duration, try func() (io.Closer, error)) (io.Closer, error) {
	deadline := clk.Now().Add(wait)
	for {
		lock, err := try()
		switch {
		case err == nil:
			return lock, nil
		case !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EADDRINUSE):
			return nil, fmt.Errorf("taking the xtables lock %s: %w", path, err)
		case !clk.Now().Before(deadline):
			return nil, fmt.Errorf("%s held by another program for %v: %w", path, wait, errLockTimeout)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the xtables lock %s: %w", path, ctx.Err())
		case <-clk.After(lockRetryInterval):
		}
	}
}
