package kerneltest

import (
	"os"
	"os/exec"
	"testing"
)

// RequireKernelEnv is the environment variable that turns a skipped kernel
// test into a failed one. CI sets it to 1.
const RequireKernelEnv = "PROXYKIT_REQUIRE_KERNEL"

// Require skips t unless this process can run kernel tests: it must be root
// on Linux, able to create a network namespace, and find each of tools on
// PATH. When PROXYKIT_REQUIRE_KERNEL=1 it fails t instead of skipping, with
// the same reason, so that a CI run cannot go green by skipping.
func Require(t testing.TB, tools ...string) {
	t.Helper()
	if reason := unavailable(tools); reason != "" {
		if os.Getenv(RequireKernelEnv) == "1" {
			t.Fatalf("kernel test cannot run (%s=1): %s", RequireKernelEnv, reason)
			return
		}
		t.Skipf("skipping kernel test: %s (set %s=1 to make this a failure)", reason, RequireKernelEnv)
	}
}

// unavailable returns why kernel tests cannot run here, or "" if they can.
func unavailable(tools []string) string {
	if reason := platformUnavailable(); reason != "" {
		return reason
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			return "tool " + tool + " not found on PATH"
		}
	}
	return ""
}
