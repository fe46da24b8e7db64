package kerneltest

import (
	"os"
	"os/exec"
	"testing"
)

// RequireKernelEnv is the environment variable that turns a skipped kernel
// test into a failed one. CI sets it to 1.
const RequireKernelEnv = "PROXYKIT_REQUIRE_KERNEL"

// VMEnv is the environment variable that the VM tier (hack/vmtest) sets
// to 1 in the VM it boots, a kernel with IPVS and dummy interfaces.
const VMEnv = "PROXYKIT_VM"

// RequireVM skips t outside the VM tier, even when
// PROXYKIT_REQUIRE_KERNEL=1: the test needs what only the VM's kernel has
// (IPVS, dummy interfaces), and the machines that run the other tiers
// lack it. Inside the VM it is [Require] with tools, where
// PROXYKIT_REQUIRE_KERNEL=1 makes a missing tool a failure.
func RequireVM(t testing.TB, tools ...string) {
	t.Helper()
	if os.Getenv(VMEnv) != "1" {
		t.Skipf("needs a kernel with IPVS and dummy interfaces: runs in the VM tier (hack/vmtest/run.sh), where %s=1", VMEnv)
		return
	}
	Require(t, tools...)
}

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
