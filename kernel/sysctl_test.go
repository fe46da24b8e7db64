package kernel

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/klog/v2/ktesting"
)

func TestSysctlReadWrite(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	root := writeTree(t, layoutThisMachine(t))
	k := &Kernel{Root: root}

	if got, err := k.ReadSysctl("net.ipv4.conf.all.route_localnet"); err != nil || got != "0" {
		t.Fatalf("ReadSysctl dotted = %q, %v", got, err)
	}
	if err := k.WriteSysctl(ctx, SysctlRouteLocalnet, "1"); err != nil {
		t.Fatal(err)
	}
	if got, err := k.ReadSysctlInt("net/ipv4/conf/all/route_localnet"); err != nil || got != 1 {
		t.Fatalf("after write: ReadSysctlInt = %d, %v", got, err)
	}

	changed, err := k.EnsureSysctlInt(ctx, SysctlIPForward, 1)
	if err != nil || !changed {
		t.Fatalf("EnsureSysctlInt 0→1 = %v, %v; want changed", changed, err)
	}
	// Make a write visible: if EnsureSysctlInt wrote again, it would
	// overwrite this marker with "1".
	if err := os.WriteFile(filepath.Join(root, "proc/sys/net/ipv4/ip_forward"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	changed, err = k.EnsureSysctlInt(ctx, SysctlIPForward, 1)
	if err != nil || changed {
		t.Fatalf("EnsureSysctlInt 1→1 = %v, %v; want unchanged", changed, err)
	}
	if data, _ := os.ReadFile(filepath.Join(root, "proc/sys/net/ipv4/ip_forward")); string(data) != "1\n" {
		t.Errorf("EnsureSysctlInt rewrote an equal value: %q", data)
	}
}

func TestSysctlMissing(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	root := writeTree(t, layoutThisMachine(t))
	k := &Kernel{Root: root}
	if _, err := k.ReadSysctl(SysctlBridgeNFCallIPTables); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadSysctl of a missing sysctl: %v, want fs.ErrNotExist", err)
	}
	if err := k.WriteSysctl(ctx, SysctlBridgeNFCallIPTables, "1"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("WriteSysctl of a missing sysctl: %v, want fs.ErrNotExist", err)
	}
	if _, err := os.Stat(filepath.Join(root, "proc/sys/net/bridge")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("WriteSysctl created files for a missing sysctl (stat: %v)", err)
	}
}

func TestSysctlBadNames(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	k := &Kernel{Root: writeTree(t, layoutThisMachine(t))}
	for _, name := range []string{"", "/etc/passwd", "../../etc/passwd", "net/../../etc/passwd", "net//ipv4", "net.ipv4.", "net/ipv4/"} {
		if _, err := k.ReadSysctl(name); err == nil {
			t.Errorf("ReadSysctl(%q) did not fail", name)
		}
		if err := k.WriteSysctl(ctx, name, "1"); err == nil {
			t.Errorf("WriteSysctl(%q) did not fail", name)
		}
	}
	for _, mp := range [][2]string{{"nf_conntrack", "../x"}, {"../nf_conntrack", "hashsize"}, {"", "hashsize"}, {"a/b", "c"}} {
		if _, err := k.ReadModuleParameter(mp[0], mp[1]); err == nil {
			t.Errorf("ReadModuleParameter(%q, %q) did not fail", mp[0], mp[1])
		}
	}
}

func TestWriteReadOnlyMounts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		mounts   string
		sysctlRO bool
		moduleRO bool
	}{
		{name: "all rw", mounts: "proc /proc proc rw 0 0\nsysfs /sys sysfs rw 0 0\n"},
		{name: "/proc/sys ro (container)", mounts: "proc /proc proc rw 0 0\nproc /proc/sys proc ro,nosuid 0 0\nsysfs /sys sysfs rw 0 0\n", sysctlRO: true},
		{name: "/sys ro (docker#24000)", mounts: "proc /proc proc rw 0 0\nsysfs /sys sysfs ro,nosuid,nodev,noexec 0 0\n", moduleRO: true},
		{name: "later rw mount on top of ro", mounts: "sysfs /sys sysfs ro 0 0\nsysfs /sys sysfs rw 0 0\n"},
		{name: "ro elsewhere does not matter", mounts: "sysfs /sys sysfs rw 0 0\ntmpfs /sys/fs/cgroup tmpfs ro 0 0\nproc /proc/sysrq proc ro 0 0\n"},
		{name: "ro root, rw /proc and /sys", mounts: "/dev/vda / ext4 ro 0 0\nproc /proc proc rw 0 0\nsysfs /sys sysfs rw 0 0\n"},
		{name: "no /proc/mounts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			files := layoutThisMachine(t)
			delete(files, "/proc/mounts")
			if tc.mounts != "" {
				files["/proc/mounts"] = tc.mounts
			}
			k := &Kernel{Root: writeTree(t, files)}

			err := k.WriteSysctl(ctx, SysctlRouteLocalnet, "1")
			if got := IsReadOnly(err); got != tc.sysctlRO || (err != nil && !tc.sysctlRO) {
				t.Errorf("WriteSysctl: %v, want read-only %v", err, tc.sysctlRO)
			}
			want := "1"
			if tc.sysctlRO {
				want = "0"
			}
			if got, _ := k.ReadSysctl(SysctlRouteLocalnet); got != want {
				t.Errorf("route_localnet = %q after write, want %q", got, want)
			}

			err = k.WriteModuleParameter(ctx, "nf_conntrack", "hashsize", "300000")
			if got := IsReadOnly(err); got != tc.moduleRO || (err != nil && !tc.moduleRO) {
				t.Errorf("WriteModuleParameter: %v, want read-only %v", err, tc.moduleRO)
			}
			want = "300000"
			if tc.moduleRO {
				want = "262144"
			}
			if got, _ := k.ReadModuleParameter("nf_conntrack", "hashsize"); got != want {
				t.Errorf("hashsize = %q after write, want %q", got, want)
			}
		})
	}
}

func TestUnescapeMountPath(t *testing.T) {
	for in, want := range map[string]string{
		`/sys`:            "/sys",
		`/mnt/my\040disk`: "/mnt/my disk",
		`/a\134b`:         `/a\b`,
		`/trailing\04`:    `/trailing\04`,
		`/bad\999`:        `/bad\999`,
	} {
		if got := unescapeMountPath(in); got != want {
			t.Errorf("unescapeMountPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestOnlineCPUs(t *testing.T) {
	for in, want := range map[string]int{"0-1\n": 2, "0": 1, "0-3,6,8-9": 7, "": -1, "3-1": -1, "a-b": -1, "0,,1": -1, "-1": -1} {
		k := &Kernel{Root: writeTree(t, map[string]string{"/sys/devices/system/cpu/online": in})}
		got, err := k.OnlineCPUs()
		if want < 0 {
			if err == nil {
				t.Errorf("OnlineCPUs(%q) = %d, want error", in, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("OnlineCPUs(%q) = %d, %v, want %d", in, got, err, want)
		}
	}
}
