package kerneltest

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// MountCgroupAndBPF mounts the cgroup v2 hierarchy and a bpffs at mount
// points of the test's own, in a temporary directory, and unmounts them
// when the test ends, so that a test that attaches BPF programs makes
// its cgroups below a directory it owns and pins nothing on the host's
// bpffs. The cgroup2 mount shows the node's one hierarchy: attach only
// to a cgroup the test makes below cgroupRoot.
func MountCgroupAndBPF(t testing.TB) (cgroupRoot, bpffs string) {
	t.Helper()
	dir := t.TempDir()
	cgroupRoot, bpffs = filepath.Join(dir, "cgroup2"), filepath.Join(dir, "bpffs")
	for _, m := range []struct{ path, fstype string }{{cgroupRoot, "cgroup2"}, {bpffs, "bpf"}} {
		if err := os.Mkdir(m.path, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("none", m.path, m.fstype, 0, ""); err != nil {
			t.Fatalf("mounting a private %s: %v", m.fstype, err)
		}
		t.Cleanup(func() {
			if err := unix.Unmount(m.path, unix.MNT_DETACH); err != nil {
				t.Errorf("unmounting %s: %v", m.path, err)
			}
		})
	}
	return cgroupRoot, bpffs
}
