package kerneltest

import (
	"bytes"
	"os/exec"
	"regexp"
	"slices"
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

// nftElements matches an element list of nft's listing.
var nftElements = regexp.MustCompile(`(?s)elements = \{(.*?)\}`)

// ListTable returns `nft list table family table` in ns with the elements
// of each set and map sorted, one a line: the kernel lists a hash set in
// the order of its buckets, which depends on the set's random seed and on
// what was added and deleted before, not on what it holds. It fails t if
// nft fails.
func ListTable(t testing.TB, ns *NS, family, table string) string {
	t.Helper()
	out := ns.MustExec(t, "nft", "list", "table", family, table)
	return nftElements.ReplaceAllStringFunc(out, func(block string) string {
		var els []string
		for _, e := range strings.Split(nftElements.FindStringSubmatch(block)[1], ",") {
			els = append(els, strings.Join(strings.Fields(e), " "))
		}
		slices.Sort(els)
		return "elements = { " + strings.Join(els, ",\n") + " }"
	})
}
