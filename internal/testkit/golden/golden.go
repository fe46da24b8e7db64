// Package golden compares what a test produced with a golden file kept in
// the package's testdata, and rewrites the file instead when the test
// binary runs with -update (go test ./pkg -run TestX -update), so that an
// intended change of output is one command and a reviewable diff.
package golden

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files with the output the tests produce")

// Check fails t with a diff unless got equals the content of the file at
// path (relative to the directory of the package under test). With -update
// it writes got to path instead, creating its directory, and passes. A
// missing file fails t and says how to create it.
func Check(t testing.TB, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run the test with -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("output differs from %s; run the test with -update to accept it (-want +got):\n%s", path, diff)
	}
}
