package runner_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/proxykit/proxykit/runner"
)

// A proxier creates one runner for its sync function, starts Loop, and
// calls Run from its event handlers. Here the sync stops the loop after its
// first run so that the example ends.
func Example() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	sync := func() error {
		fmt.Println("syncing rules")
		cancel()
		return nil
	}
	r := runner.New("sync-proxy-rules", sync, time.Second, 5*time.Second, time.Hour)

	r.Run() // an event arrived before Loop started: the first run serves it
	r.Run() // and this one too: requests coalesce
	r.Loop(ctx)
	fmt.Println("stopped")
	// Output:
	// syncing rules
	// stopped
}

// An observer sees every run, which is how a proxier exports metrics such
// as the sync duration and the time of the last successful sync.
func ExampleWithObserver() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	sync := func() error {
		cancel()
		return errors.New("iptables-restore failed")
	}
	observe := func(info runner.RunInfo) {
		if info.Err != nil {
			fmt.Println("sync failed:", info.Err)
			return
		}
		fmt.Println("sync succeeded")
	}
	r := runner.New("sync-proxy-rules", sync, time.Second, 5*time.Second, time.Hour,
		runner.WithObserver(observe))
	r.Loop(ctx)
	// Output:
	// sync failed: iptables-restore failed
}
