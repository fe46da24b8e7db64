package kernel_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/proxykit/proxykit/kernel"
)

// fakeNode writes a small root directory for a node whose kernel has
// everything built in except IPVS, and no loadable modules.
func fakeNode() string {
	root, err := os.MkdirTemp("", "kernel-example")
	if err != nil {
		panic(err)
	}
	files := map[string]string{
		"proc/sys/kernel/osrelease": "6.18.44-fc-v669\n",
		"boot/config-6.18.44-fc-v669": "# CONFIG_MODULES is not set\n" +
			"CONFIG_NF_CONNTRACK=y\nCONFIG_IP_SET=y\nCONFIG_NETFILTER_XT_SET=y\n" +
			"CONFIG_IP_SET_HASH_IPPORT=y\nCONFIG_IP_SET_HASH_IPPORTIP=y\nCONFIG_IP_SET_HASH_IPPORTNET=y\n" +
			"CONFIG_IP_SET_HASH_NET=y\nCONFIG_IP_SET_HASH_NETPORT=y\nCONFIG_IP_SET_BITMAP_PORT=y\n" +
			"# CONFIG_IP_VS is not set\n",
		"proc/sys/net/ipv4/conf/all/route_localnet": "0\n",
	}
	for p, content := range files {
		full := filepath.Join(root, p)
		_ = os.MkdirAll(filepath.Dir(full), 0o755)
		_ = os.WriteFile(full, []byte(content), 0o644)
	}
	return root
}

func ExampleKernel_CanUseIPVS() {
	root := fakeNode()
	defer os.RemoveAll(root)

	k := &kernel.Kernel{Root: root} // kernel.New() on a real node
	err := k.CanUseIPVS(context.Background(), "rr", "mh")
	var missing *kernel.IPVSUnavailableError
	if errors.As(err, &missing) {
		fmt.Println("IPVS mode unavailable; missing:", missing.Missing())
	}
	// Output:
	// IPVS mode unavailable; missing: [ip_vs ip_vs_rr ip_vs_wrr ip_vs_sh ip_vs_mh]
}

func ExampleKernel_EnsureSysctlInt() {
	root := fakeNode()
	defer os.RemoveAll(root)

	k := &kernel.Kernel{Root: root}
	changed, err := k.EnsureSysctlInt(context.Background(), kernel.SysctlRouteLocalnet, 1)
	fmt.Println(changed, err)
	changed, err = k.EnsureSysctlInt(context.Background(), kernel.SysctlRouteLocalnet, 1)
	fmt.Println(changed, err)
	// Output:
	// true <nil>
	// false <nil>
}

func ExampleParseVersion() {
	v, err := kernel.ParseVersion("3.10.0-957.1.3.el7.x86_64")
	if err != nil {
		panic(err)
	}
	fmt.Println(v.Major, v.Minor, v.Patch, v.AtLeast(kernel.Version{Major: 4, Minor: 19}))
	fmt.Println(kernel.RequiredIPVSModules(v))
	// Output:
	// 3 10 0 false
	// [ip_vs ip_vs_rr ip_vs_wrr ip_vs_sh nf_conntrack_ipv4]
}
