package kernel

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"k8s.io/utils/exec"
	fakeexec "k8s.io/utils/exec/testing"
)

// writeTree creates a directory tree standing for a node's root: each key
// is an absolute path ("/proc/modules"), each value the file's content.
func writeTree(t testing.TB, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func gzipped(t testing.TB, s string) string {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func readTestdata(t testing.TB, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// fakeModprobe is an exec.Interface on which `modprobe -- NAME` succeeds
// for the modules in loadable and fails for others; any other command
// fails the test.
type fakeModprobe struct {
	t        testing.TB
	loadable []string
	calls    []string
}

func (f *fakeModprobe) Exec() exec.Interface {
	fe := &fakeexec.FakeExec{}
	for range 100 {
		fe.CommandScript = append(fe.CommandScript, func(cmd string, args ...string) exec.Cmd {
			fc := &fakeexec.FakeCmd{}
			fc.CombinedOutputScript = []fakeexec.FakeAction{func() ([]byte, []byte, error) {
				if cmd != "modprobe" || len(args) != 2 || args[0] != "--" {
					f.t.Errorf("unexpected command %s %v", cmd, args)
					return nil, nil, fakeexec.FakeExitError{Status: 1}
				}
				f.calls = append(f.calls, args[1])
				if slices.Contains(f.loadable, args[1]) {
					return nil, nil, nil
				}
				return []byte("modprobe: FATAL: Module " + args[1] + " not found"), nil, fakeexec.FakeExitError{Status: 1}
			}}
			return fakeexec.InitFakeCmd(fc, cmd, args...)
		})
	}
	return fe
}

// Node layouts the tests run against, modelled on real machines.

// layoutThisMachine is the test machine: a 6.18 kernel without loadable
// modules (no /proc/modules, CONFIG_MODULES unset), its config in
// /proc/config.gz, netfilter and ipset built in, IPVS not built.
func layoutThisMachine(t testing.TB) map[string]string {
	return map[string]string{
		"/proc/sys/kernel/osrelease":                          "6.18.44-fc-v669\n",
		"/proc/config.gz":                                     gzipped(t, readTestdata(t, "config-6.18.44-fc-v669")),
		"/proc/mounts":                                        "proc /proc proc rw,relatime 0 0\nsysfs /sys sysfs rw,relatime 0 0\n",
		"/sys/devices/system/cpu/online":                      "0-1\n",
		"/proc/sys/net/ipv4/ip_forward":                       "0\n",
		"/proc/sys/net/ipv4/conf/all/route_localnet":          "0\n",
		"/sys/module/nf_conntrack/parameters/hashsize":        "262144\n",
		"/proc/sys/net/netfilter/nf_conntrack_max":            "262144\n",
		"/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal": "0\n",
	}
}

// layoutDebianCloud is a Debian 12 cloud image: loadable modules, a few
// netfilter ones loaded, IPVS and ipset built as modules (=m).
func layoutDebianCloud(t testing.TB) map[string]string {
	return map[string]string{
		"/proc/sys/kernel/osrelease": "6.1.0-56-cloud-amd64\n",
		"/proc/modules": `nf_conntrack 188416 2 nf_nat,xt_conntrack, Live 0x0000000000000000
nf_defrag_ipv6 24576 1 nf_conntrack, Live 0x0000000000000000
nf_defrag_ipv4 16384 1 nf_conntrack, Live 0x0000000000000000
nf_nat 57344 1 iptable_nat, Live 0x0000000000000000
xt_conntrack 16384 1 - Live 0x0000000000000000
iptable_nat 16384 1 - Live 0x0000000000000000
ip_tables 36864 1 iptable_nat, Live 0x0000000000000000
x_tables 57344 3 xt_conntrack,iptable_nat,ip_tables, Live 0x0000000000000000
br_netfilter 36864 0 - Live 0x0000000000000000
bridge 315392 1 br_netfilter, Live 0x0000000000000000
`,
		"/lib/modules/6.1.0-56-cloud-amd64/modules.builtin": `kernel/fs/ext4/ext4.ko
kernel/net/ipv4/tcp_cubic.ko
kernel/net/unix/unix.ko
kernel/net/ipv6/ipv6.ko
`,
		"/boot/config-6.1.0-56-cloud-amd64": `#
# Automatically generated file; DO NOT EDIT.
# Linux/x86 6.1.0 Kernel Configuration
#
CONFIG_MODULES=y
CONFIG_NETFILTER=y
CONFIG_NF_CONNTRACK=m
CONFIG_IP_SET=m
CONFIG_IP_SET_HASH_IPPORT=m
CONFIG_NETFILTER_XT_SET=m
CONFIG_IP_VS=m
CONFIG_IP_VS_RR=m
CONFIG_IP_VS_WRR=m
CONFIG_IP_VS_SH=m
CONFIG_IP_VS_MH=m
`,
	}
}

// layoutCentOS7 is a CentOS 7 node running IPVS mode: a 3.10 kernel, so
// conntrack is nf_conntrack_ipv4, with everything loaded already and no
// kernel config readable.
func layoutCentOS7(t testing.TB) map[string]string {
	var mods bytes.Buffer
	for _, m := range append(RequiredIPVSModules(Version{Major: 3, Minor: 10}), IPSetModules()...) {
		mods.WriteString(m + " 16384 0 - Live 0xffffffffc0000000\n")
	}
	return map[string]string{
		"/proc/sys/kernel/osrelease": "3.10.0-957.1.3.el7.x86_64\n",
		"/proc/modules":              mods.String(),
		"/lib/modules/3.10.0-957.1.3.el7.x86_64/modules.builtin": "kernel/net/unix/unix.ko\n",
	}
}
