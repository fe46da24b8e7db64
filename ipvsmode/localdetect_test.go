package ipvsmode_test

import (
	"bytes"
	"context"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/internal/testkit/golden"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/proxy"
)

// TestTranslateLocalDetection renders the rules of each local-detection
// mode (golden files) and traces packets through them: traffic to a
// cluster IP that is not local is marked for masquerading, local traffic
// is not; in NodeCIDR mode the pod range is the input's, and without one
// only what the node sends from a service address is masqueraded.
func TestTranslateLocalDetection(t *testing.T) {
	const marked, unmarked = "ACCEPT local to 10.96.0.10:80 mark=0x4000 p=1", "ACCEPT local to 10.96.0.10:80 p=1"
	fromIface := func(src netip.Addr, iface string) iptablestest.Packet {
		p := tcpTo(src, "10.96.0.10:80")
		p.InInterface = iface
		return p
	}
	localPodClient := addr("10.244.1.9")
	for _, tc := range []struct {
		name     string
		node     proxy.NodeConfig
		podCIDRs []netip.Prefix
		traces   []trace
	}{{
		name: "detect-local-node-cidr",
		node: proxy.NodeConfig{DetectLocalMode: proxy.LocalModeNodeCIDR, ClusterCIDRs: []netip.Prefix{prefix("10.244.0.0/16")}},
		// The node's range of the other family first: it is not read.
		podCIDRs: []netip.Prefix{prefix("fd00:244:1::/64"), prefix("10.244.1.0/24")},
		traces: []trace{
			{"from a pod of the node", fromIface(localPodClient, "cni0"), []string{unmarked}},
			{"from a pod elsewhere, in the cluster CIDR", fromIface(otherPod, "eth0"), []string{marked}},
		},
	}, {
		name: "detect-local-node-cidr-unallocated",
		node: proxy.NodeConfig{DetectLocalMode: proxy.LocalModeNodeCIDR, ClusterCIDRs: []netip.Prefix{prefix("10.244.0.0/16")}},
		traces: []trace{
			{"from a pod of the node", fromIface(localPodClient, "cni0"), []string{unmarked}},
			{"from outside", fromIface(outsider, "eth0"), []string{unmarked}},
		},
	}, {
		name: "detect-local-bridge-interface",
		node: proxy.NodeConfig{DetectLocalMode: proxy.LocalModeBridgeInterface, BridgeInterface: "cni0"},
		traces: []trace{
			{"through the bridge", fromIface(otherPod, "cni0"), []string{unmarked}},
			{"a pod address through another interface", fromIface(localPodClient, "eth0"), []string{marked}},
		},
	}, {
		name: "detect-local-interface-name-prefix",
		node: proxy.NodeConfig{DetectLocalMode: proxy.LocalModeInterfaceNamePrefix, InterfaceNamePrefix: "veth"},
		traces: []trace{
			{"through a veth", fromIface(otherPod, "veth12ab"), []string{unmarked}},
			{"through another interface", fromIface(localPodClient, "eth0"), []string{marked}},
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := modeCfg
			cfg.Node = tc.node
			cfg.Node.Name = nodeName
			tr, err := ipvsmode.NewWriter(cfg)
			if err != nil {
				t.Fatal(err)
			}
			svcs, eps := portMaps(t, cfg.Family, svcPort{name: "default/web", clusterIP: "10.96.0.10", port: 80, endpoints: []endpoint{remotePod}})
			res := tr.Sync(context.Background(), &proxy.FamilyInput{Services: svcs, Endpoints: eps, NodeIPs: modeNodeIPs, PodCIDRs: tc.podCIDRs})
			var out bytes.Buffer
			if _, err := res.WriteTo(&out); err != nil {
				t.Fatal(err)
			}
			golden.Check(t, filepath.Join("testdata", "mode", tc.name+".golden"), out.Bytes())
			n := newNode(modeNodeIPs...)
			n.apply(t, res)
			for _, trc := range tc.traces {
				if diff := cmp.Diff(trc.want, verdicts(n.trace(t, trc.p))); diff != "" {
					t.Errorf("%s (-want +got):\n%s", trc.name, diff)
				}
			}
		})
	}
}
