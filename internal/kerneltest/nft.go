package kerneltest

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

// CheckNFT fails t unless the real nft takes input as `nft -f` would, in
// a throwaway namespace that holds no ruleset: nft --check evaluates it in
// the kernel and applies nothing, which it then checks. Call [Require]
// with "nft" first.
func CheckNFT(t testing.TB, input []byte) {
	t.Helper()
	ns := NewNS(t)
	var stderr bytes.Buffer
	if err := ns.Do(func() error {
		cmd := exec.Command("nft", "--check", "-f", "-")
		cmd.Stdin, cmd.Stderr = bytes.NewReader(input), &stderr
		return cmd.Run()
	}); err != nil {
		t.Fatalf("nft --check refused the input: %v\n%s\ninput:\n%s", err, stderr.String(), input)
	}
	if got := ns.MustExec(t, "nft", "list", "ruleset"); strings.TrimSpace(got) != "" {
		t.Errorf("nft --check applied something:\n%s", got)
	}
}
