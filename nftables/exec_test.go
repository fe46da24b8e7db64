package nftables_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/nftables"
)

// stuckNFT is a knftables.Fake whose Run, while hang is set, behaves as
// knftables' Run of an nft that hangs: it returns "signal: killed" when
// its context ends, as knftables does once it has killed nft; or, with
// ignoreKill, only when release is closed, as when the killed nft does
// not exit or a child of it keeps its output open.
type stuckNFT struct {
	*knftables.Fake
	hang       atomic.Bool
	ignoreKill bool
	release    chan struct{}
	runs       atomic.Int32
}

func (s *stuckNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	s.runs.Add(1)
	if !s.hang.Load() {
		return s.Fake.Run(ctx, tx)
	}
	if s.ignoreKill {
		<-s.release
	} else {
		<-ctx.Done()
	}
	return errors.New("signal: killed")
}

// runWithin runs tx on nft and fails t if that takes longer than a
// minute (a generous bound on what must return at once).
func runWithin(t *testing.T, ctx context.Context, nft knftables.Interface, tx *knftables.Transaction) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- nft.Run(ctx, tx) }()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("Run still waits for the hung nft")
		return nil
	}
}

func addTable(nft knftables.Interface) *knftables.Transaction {
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{})
	return tx
}

// TestBoundedInterface checks that a Run whose nft hangs returns, at the
// timeout, an error IsCommandTimeout recognises, whether knftables
// returns once it has killed nft or not at all; that in the second case
// the calls after fail at once, without running nft, until the stuck one
// returns; that a call the caller's context ends is no timeout; and that
// calls that end in time pass their results through.
func TestBoundedInterface(t *testing.T) {
	const timeout, waitDelay = 20 * time.Millisecond, 20 * time.Millisecond
	t.Run("killed", func(t *testing.T) {
		s := &stuckNFT{Fake: knftables.NewFake(knftables.IPv4Family, "t")}
		nft := nftables.NewBoundedInterface(s, timeout, waitDelay)
		s.hang.Store(true)
		err := runWithin(t, context.Background(), nft, addTable(nft))
		if !nftables.IsCommandTimeout(err) || !strings.Contains(err.Error(), "timed out after "+timeout.String()) {
			t.Fatalf("Run of a hung nft: error %v, want a timeout that names its bound", err)
		}
		s.hang.Store(false)
		if err := runWithin(t, context.Background(), nft, addTable(nft)); err != nil {
			t.Fatalf("Run after the timeout: %v", err)
		}
		if _, err := s.Fake.List(context.Background(), "chain"); err != nil {
			t.Errorf("the table the second Run added is not there: %v", err)
		}
	})
	t.Run("not exiting", func(t *testing.T) {
		s := &stuckNFT{Fake: knftables.NewFake(knftables.IPv4Family, "t"), ignoreKill: true, release: make(chan struct{})}
		nft := nftables.NewBoundedInterface(s, timeout, waitDelay)
		s.hang.Store(true)
		err := runWithin(t, context.Background(), nft, addTable(nft))
		if !nftables.IsCommandTimeout(err) {
			t.Fatalf("Run of an nft that does not exit: error %v, want a timeout", err)
		}
		err = runWithin(t, context.Background(), nft, addTable(nft))
		if !nftables.IsCommandTimeout(err) || s.runs.Load() != 1 {
			t.Fatalf("Run while the killed nft has not exited: error %v after %d runs; want a timeout, and no second run", err, s.runs.Load())
		}
		s.hang.Store(false)
		close(s.release)
		deadline := time.Now().Add(time.Minute)
		for err != nil && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
			err = runWithin(t, context.Background(), nft, addTable(nft))
		}
		if err != nil {
			t.Fatalf("Run once the killed nft has exited: %v", err)
		}
	})
	t.Run("cancelled by the caller", func(t *testing.T) {
		s := &stuckNFT{Fake: knftables.NewFake(knftables.IPv4Family, "t")}
		nft := nftables.NewBoundedInterface(s, time.Hour, waitDelay)
		s.hang.Store(true)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := runWithin(t, ctx, nft, addTable(nft)); err == nil || nftables.IsCommandTimeout(err) {
			t.Errorf("Run cancelled by the caller: error %v, want a failure that is not a timeout", err)
		}
	})
	t.Run("in time", func(t *testing.T) {
		fake := knftables.NewFake(knftables.IPv4Family, "t")
		nft := nftables.BoundedInterface(fake, time.Hour)
		tx := addTable(nft)
		tx.Add(&knftables.Chain{Name: "c"})
		tx.Add(&knftables.Rule{Chain: "c", Rule: "accept"})
		if err := nft.Run(context.Background(), tx); err != nil {
			t.Fatal(err)
		}
		chains, err := nft.List(context.Background(), "chain")
		if err != nil {
			t.Fatal(err)
		}
		rules, err := nft.ListRules(context.Background(), "c")
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"c", "accept"}, append(chains, rules[0].Rule)); diff != "" {
			t.Errorf("listing through the bound (-want +got):\n%s", diff)
		}
		_, err = nft.ListRules(context.Background(), "missing")
		if !knftables.IsNotFound(err) {
			t.Errorf("ListRules of a missing chain: %v, want knftables' not-found error", err)
		}
	})
	t.Run("no bound", func(t *testing.T) {
		fake := knftables.NewFake(knftables.IPv4Family, "t")
		for _, d := range []time.Duration{0, -time.Second} {
			if nft := nftables.BoundedInterface(fake, d); nft != knftables.Interface(fake) {
				t.Errorf("BoundedInterface with timeout %v wraps the Interface, want it returned as it is", d)
			}
		}
	})
}
