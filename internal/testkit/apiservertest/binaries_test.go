package apiservertest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBinaries checks how the tier finds its binaries: PROXYKIT_APISERVER_BIN
// wins when it holds both, and a directory missing one is an error that
// says how to build them, which Require turns into a skip or, in CI, a
// failure.
func TestBinaries(t *testing.T) {
	full, partial := t.TempDir(), t.TempDir()
	for _, f := range []string{filepath.Join(full, "kube-apiserver"), filepath.Join(full, "etcd"), filepath.Join(partial, "etcd")} {
		if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(BinEnv, full)
	if got, err := binaries(); err != nil || got != full {
		t.Errorf("with both binaries: %q, %v; want %q", got, err, full)
	}
	t.Setenv(BinEnv, partial)
	_, err := binaries()
	if err == nil || !strings.Contains(err.Error(), "kube-apiserver") || !strings.Contains(err.Error(), buildScript) {
		t.Errorf("without kube-apiserver: %v, want an error naming it and %s", err, buildScript)
	}
}
