package nftables

import (
	"errors"
	"os"
	"testing"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
)

// TestKernelStateGenerationSocket checks the socket Generation keeps: it
// is the same from call to call; a broken one (closed under the
// KernelState) is replaced by one in the KernelState's namespace, not in
// the namespace of the thread that calls (the test's, the host's), which
// a commit in the KernelState's namespace then shows; a namespace that
// cannot be dialled is an error, not a panic; Close closes the socket and
// makes Generation fail.
func TestKernelStateGenerationSocket(t *testing.T) {
	kerneltest.Require(t, "nft")
	ns := kerneltest.NewNS(t)
	f, err := os.Open("/run/netns/" + ns.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := NewKernelState(int(f.Fd())).(*netlinkState)
	g0, err := s.Generation()
	if err != nil {
		t.Fatal(err)
	}
	kept := s.gen
	if g, err := s.Generation(); err != nil || g != g0 || s.gen != kept {
		t.Fatalf("second read: generation %d (first %d), error %v, same socket %v; want the same generation on the same socket", g, g0, err, s.gen == kept)
	}

	kept.Close()
	ns.MustExec(t, "nft", "add", "table", "ip", "generation-probe")
	g, err := s.Generation()
	if err != nil {
		t.Fatalf("read on a broken socket: %v; want it dialled again", err)
	}
	if s.gen == nil || s.gen == kept {
		t.Error("the broken socket was not replaced")
	}
	if g != nextGen(g0, 1) {
		t.Errorf("generation %d after one commit in the namespace, want %d: the new socket reads another namespace", g, nextGen(g0, 1))
	}

	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := s.Generation(); !errors.Is(err, errStateClosed) {
		t.Errorf("Generation after Close: %v, want %v", err, errStateClosed)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}

	// Not a namespace: dialling fails, every time, with an error.
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	bad := NewKernelState(int(null.Fd())).(*netlinkState)
	for range 2 {
		if _, err := bad.Generation(); err == nil || bad.gen != nil {
			t.Errorf("Generation in no namespace: error %v, socket kept %v; want an error and no socket", err, bad.gen != nil)
		}
	}
}
