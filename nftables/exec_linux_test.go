package nftables_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/nftables"
)

// TestBoundedInterfaceSameThread checks that a bounded call runs on the
// caller's thread: knftables execs nft from it, and a caller that entered
// a network namespace on its locked thread (as proxier and tests do) must
// get nft there, not in the namespace of another thread.
func TestBoundedInterfaceSameThread(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	want := unix.Gettid()
	var got int
	s := &stuckNFT{Fake: knftables.NewFake(knftables.IPv4Family, "t"), onRun: func() { got = unix.Gettid() }}
	nft := nftables.BoundedInterface(s, time.Hour)
	if err := nft.Run(context.Background(), addTable(nft)); err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("Run ran on thread %d, want the caller's, %d", got, want)
	}
}
