package apiservertest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
)

// BinEnv names the directory that holds the kube-apiserver, etcd and
// kube-proxy binaries. `make test` sets it to what hack/apiserver/build.sh
// printed.
const BinEnv = "PROXYKIT_APISERVER_BIN"

// binaryNames are the binaries of the tier, all built by one run of the
// build script into one directory.
var binaryNames = []string{"kube-apiserver", "etcd", "kube-proxy"}

// buildScript is the script that builds and caches the binaries, relative
// to the repository's root.
const buildScript = "hack/apiserver/build.sh"

// Require skips t unless this machine can run the API server tier: it
// must be able to run kernel tests (see [kerneltest.Require]; the cluster
// lives in a network namespace) and have kube-apiserver, etcd and
// kube-proxy built.
// With PROXYKIT_REQUIRE_KERNEL=1 it fails t instead, with the same reason.
// It returns the directory of the binaries: $PROXYKIT_APISERVER_BIN, or
// else the cache of hack/apiserver/build.sh, which it asks with -n and so
// never builds (a cold build takes longer than a test may).
func Require(t testing.TB, tools ...string) string {
	t.Helper()
	kerneltest.Require(t, tools...)
	dir, err := binaries()
	if err != nil {
		if os.Getenv(kerneltest.RequireKernelEnv) == "1" {
			t.Fatalf("API server tier cannot run (%s=1): %v", kerneltest.RequireKernelEnv, err)
			return ""
		}
		t.Skipf("skipping API server test: %v (set %s=1 to make this a failure)", err, kerneltest.RequireKernelEnv)
	}
	return dir
}

// KubeProxy returns the path of the real kube-proxy in bin, the directory
// [Require] returned: the release of kube-apiserver's, for the tests that
// run it beside proxykit's proxier against the same API server.
func KubeProxy(bin string) string { return filepath.Join(bin, "kube-proxy") }

// binaries finds the directory of the tier's binaries.
func binaries() (string, error) {
	dir := os.Getenv(BinEnv)
	if dir == "" {
		root, err := repoRoot()
		if err != nil {
			return "", err
		}
		var stdout, stderr bytes.Buffer
		cmd := exec.Command("sh", filepath.Join(root, buildScript), "-n")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("%s -n: %w: %s", buildScript, err, strings.TrimSpace(stderr.String()))
		}
		dir = strings.TrimSpace(stdout.String())
	}
	for _, name := range binaryNames {
		if _, err := exec.LookPath(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("%s: %w (build it with %s)", name, err, buildScript)
		}
	}
	return dir, nil
}

// repoRoot walks up from the working directory (a package's, under go
// test) to the directory that holds the build script.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, buildScript)); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no " + buildScript + " above the working directory; set " + BinEnv)
		}
		dir = parent
	}
}
