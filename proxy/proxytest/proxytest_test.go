package proxytest_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/proxy/proxytest"
)

// TestSortRuns checks that SortRuns sorts the runs of lines of one key
// and leaves lines of no key, and the order of the runs, as they are.
func TestSortRuns(t *testing.T) {
	// The key of "set X ..." is X; other lines have none.
	key := func(line string) string {
		if rest, ok := strings.CutPrefix(line, "set "); ok {
			name, _, _ := strings.Cut(rest, " ")
			return name
		}
		return ""
	}
	for _, tc := range []struct {
		name, dump, want string
	}{
		{"empty", "", ""},
		{"no keys", "b\na", "b\na"},
		{"one run", "set s 2\nset s 1\nset s 3", "set s 1\nset s 2\nset s 3"},
		{"runs of two keys stay apart", "set t 2\nset t 1\nset s 9\nset s 0", "set t 1\nset t 2\nset s 0\nset s 9"},
		{"a line of no key ends a run", "set s 2\nrule\nset s 1\nset s 0\n", "set s 2\nrule\nset s 0\nset s 1\n"},
	} {
		if diff := cmp.Diff(tc.want, proxytest.SortRuns(tc.dump, key)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}
