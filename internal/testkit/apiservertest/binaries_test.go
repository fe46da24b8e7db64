package apiservertest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBinaries checks how the tier finds its binaries: PROXYKIT_APISERVER_BIN
// wins when it holds all three, and a directory missing one is an error
// that names it and says how to build them, which Require turns into a skip
// or, in CI, a failure.
func TestBinaries(t *testing.T) {
	write := func(dir string, names ...string) string {
		for _, name := range names {
			if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	full := write(t.TempDir(), "kube-apiserver", "etcd", "kube-proxy")
	t.Setenv(BinEnv, full)
	if got, err := binaries(); err != nil || got != full {
		t.Errorf("with every binary: %q, %v; want %q", got, err, full)
	}
	if got, want := KubeProxy(full), filepath.Join(full, "kube-proxy"); got != want {
		t.Errorf("KubeProxy(%q) = %q, want %q", full, got, want)
	}
	for _, missing := range []string{"kube-apiserver", "kube-proxy"} {
		var rest []string
		for _, name := range binaryNames {
			if name != missing {
				rest = append(rest, name)
			}
		}
		t.Setenv(BinEnv, write(t.TempDir(), rest...))
		_, err := binaries()
		if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), buildScript) {
			t.Errorf("without %s: %v, want an error naming it and %s", missing, err, buildScript)
		}
	}
}
