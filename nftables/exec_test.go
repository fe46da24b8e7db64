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
// its context ends, as knftables does once it has killed nft. onRun, if
// set, is called first.
type stuckNFT struct {
	*knftables.Fake
	hang  atomic.Bool
	onRun func()
}

func (s *stuckNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	if s.onRun != nil {
		s.onRun()
	}
	if !s.hang.Load() {
		return s.Fake.Run(ctx, tx)
	}
	<-ctx.Done()
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
// timeout, an error IsCommandTimeout recognises, and the next Run works;
// that a call the caller's context ends is no timeout; and that calls
// that end in time pass their results through.
func TestBoundedInterface(t *testing.T) {
	const timeout = 20 * time.Millisecond
	t.Run("killed", func(t *testing.T) {
		s := &stuckNFT{Fake: knftables.NewFake(knftables.IPv4Family, "t")}
		nft := nftables.BoundedInterface(s, timeout)
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
	t.Run("cancelled by the caller", func(t *testing.T) {
		s := &stuckNFT{Fake: knftables.NewFake(knftables.IPv4Family, "t")}
		nft := nftables.BoundedInterface(s, time.Hour)
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
