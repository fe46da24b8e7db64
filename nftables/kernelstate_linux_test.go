package nftables

import (
	"errors"
	"os"
	"strings"
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
	s := NewKernelState("/run/netns/" + ns.Name).(*netlinkState)
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

	// Not a namespace, and no file at all: dialling fails, every time,
	// with an error (naming the path when it cannot be opened).
	missing := "/run/netns/" + ns.Name + "-missing"
	for _, path := range []string{os.DevNull, missing} {
		bad := NewKernelState(path).(*netlinkState)
		for range 2 {
			_, err := bad.Generation()
			if err == nil || bad.gen != nil {
				t.Errorf("Generation in %s: error %v, socket kept %v; want an error and no socket", path, err, bad.gen != nil)
			}
			if path == missing && err != nil && !strings.Contains(err.Error(), missing) {
				t.Errorf("Generation in %s: error %v does not name the path", path, err)
			}
		}
	}
}
