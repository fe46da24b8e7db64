package iptables_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/internal/testkit/writertest"
	"github.com/proxykit/proxykit/iptables"
)

// applyKernel applies res to the node's kernel, with the writer's own
// jump rules before a full sync, and reports the outcome to the writer.
func (k *kernelNode) applyKernel(t *testing.T, res iptables.SyncResult) {
	t.Helper()
	ctx := context.Background()
	err := k.node.Do(func() error {
		if res.Full {
			if err := k.w.EnsureJumpRules(ctx, k.ipt); err != nil {
				return err
			}
		}
		return k.ipt.RestoreAll(ctx, res.Payload, iptables.NoFlushTables, iptables.RestoreCounters)
	})
	k.w.Applied(err)
	if err != nil {
		t.Fatalf("%s sync: %v\n%s", syncKind(res), err, res.Payload)
	}
}

// TestWriterKernelBadServicePort runs the writer's payloads through the
// real iptables-restore while the maps hold service ports that would have
// broken every restore: a node port of 70000, an affinity timeout of 0,
// and a namespace written to end the nat table and flush the node's
// INPUT chain. The node's own INPUT rule and policy stay, a good Service
// stays reachable, and a Service added later, in a partial sync, becomes
// reachable.
func TestWriterKernelBadServicePort(t *testing.T) {
	for _, backend := range []iptables.Backend{iptables.BackendLegacy, iptables.BackendNFT} {
		t.Run(string(backend), func(t *testing.T) {
			kerneltest.Require(t, kernelTools(backend)...)
			k := newKernelNode(t, backend)
			// The node's own firewall, which the injection would flush.
			nodeIPTables(t, k, backend, "-A", "INPUT", "-p", "tcp", "--dport", "9", "-j", "DROP")
			nodeIPTables(t, k, backend, "-P", "INPUT", "DROP")
			nodeIPTables(t, k, backend, "-I", "INPUT", "-j", "ACCEPT")

			in := k.c.input()
			web := svcPortName(scnNS, "web", "tcp")
			for _, bad := range []struct {
				name string
				mod  func(*skewedPort)
			}{
				{"node-port", func(p *skewedPort) { p.nodePort = ptrTo(70000) }},
				{"affinity", func(p *skewedPort) {
					p.affinity = ptrTo(v1.ServiceAffinityClientIP)
					p.age = ptrTo(0)
				}},
				{"x\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\n-F INPUT\nCOMMIT\n*nat\n#", func(*skewedPort) {}},
			} {
				name := svcPortName(bad.name, "bad", "tcp")
				p := &skewedPort{ServicePort: k.c.ServiceMap[web], clusterIP: ptrTo(netip.MustParseAddr("10.96.0.30"))}
				bad.mod(p)
				k.c.ServiceMap[name] = p
				k.c.EndpointsMap[name] = k.c.EndpointsMap[web]
				writertest.MarkChanged(&in.ServiceChanges, name)
			}
			k.applyKernel(t, k.w.Sync(context.Background(), in))
			k.expectBalanced(t, "tcp", scnWebIP, 80, 40, "pod-a", "pod-b")
			checkNodeInput(t, k, backend)

			// A Service added while the bad ports are still in the maps.
			k.c.setService(makeService(scnNS, "added", scnAddedIP))
			k.c.setEndpoints(scnNS, "added", tcp8080, scnEP(scnPodA))
			res := k.w.Sync(context.Background(), k.c.input())
			if res.Full {
				t.Fatal("adding a Service made a full sync")
			}
			k.applyKernel(t, res)
			k.expectOnly(t, "tcp", scnAddedIP, 80, 10, "pod-a")
			k.expectBalanced(t, "tcp", scnWebIP, 80, 40, "pod-a", "pod-b")
			checkNodeInput(t, k, backend)
		})
	}
}

// nodeIPTables runs the backend's iptables in the node with a lock file
// of the node's own, since the default lock is the host's.
func nodeIPTables(t *testing.T, k *kernelNode, backend iptables.Backend, args ...string) {
	t.Helper()
	lock := t.TempDir() + "/xtables.lock"
	k.node.MustExec(t, "env", append([]string{"XTABLES_LOCKFILE=" + lock, "iptables-" + string(backend), "-w"}, args...)...)
}

// checkNodeInput checks that the node's INPUT chain still has the policy
// and rules the test gave it, plus the writer's jumps.
func checkNodeInput(t *testing.T, k *kernelNode, backend iptables.Backend) {
	t.Helper()
	save := string(k.save(t, iptables.TableFilter))
	for _, want := range []string{":INPUT DROP", "-A INPUT -j ACCEPT\n", "-A INPUT -p tcp -m tcp --dport 9 -j DROP\n"} {
		if !strings.Contains(save, want) {
			t.Errorf("the node's filter table lost %q:\n%s", want, save)
		}
	}
}

// TestWriterKernelLocalhostNodePorts checks kube-proxy's localhost node
// ports: with them on (and route_localnet set, as the proxier does), a
// connection from the node to 127.0.0.1:<node port> reaches an endpoint;
// with them off it is refused, as nothing listens there. And with
// route_localnet on, a packet another host sends to the node's loopback
// range is dropped by KUBE-FIREWALL, which it would otherwise pass.
func TestWriterKernelLocalhostNodePorts(t *testing.T) {
	for _, backend := range []iptables.Backend{iptables.BackendLegacy, iptables.BackendNFT} {
		t.Run(string(backend), func(t *testing.T) {
			kerneltest.Require(t, kernelTools(backend)...)
			localhost := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), scnNodePort)
			for _, on := range []bool{true, false} {
				k := newKernelNode(t, backend)
				cfg := scnWriterConfig(k.ipt.HasRandomFully())
				cfg.LocalhostNodePorts = on
				k.w = mustWriter(t, cfg)
				if k.w.RouteLocalnet() != on {
					t.Fatalf("RouteLocalnet() = %v with LocalhostNodePorts %v", !on, on)
				}
				if on {
					k.node.Sysctl(t, "net.ipv4.conf.all.route_localnet", "1")
				}
				k.applyKernel(t, k.w.Sync(context.Background(), k.c.input()))
				r, err := kerneltest.Dial(k.node, "tcp", localhost, 3*time.Second)
				switch {
				case on && err != nil:
					t.Errorf("localhost node ports on: %s: %v", localhost, err)
				case on && r.Name != "pod-a" && r.Name != "pod-b":
					t.Errorf("localhost node ports on: %s reached %q, want an endpoint", localhost, r.Name)
				case !on && !errors.Is(err, syscall.ECONNREFUSED):
					t.Errorf("localhost node ports off: %s: got %v (reached %q), want connection refused", localhost, err, r.Name)
				}
				if on {
					testMartianLocalnet(t, k, backend)
				}
			}
		})
	}
}

// testMartianLocalnet sends, from the client namespace, a connection to
// 127.0.0.5 on the node, to a listener of the node: the client routes
// that range to the node instead of its own loopback. KUBE-FIREWALL must
// drop it; once the rule is flushed, the same connection goes through,
// which shows that the rule is what stopped it.
func testMartianLocalnet(t *testing.T, k *kernelNode, backend iptables.Backend) {
	t.Helper()
	const port = 9999
	kerneltest.StartBackend(t, k.node, "node", port)
	k.client.MustExec(t, "ip", "route", "del", "table", "local", "local", "127.0.0.0/8", "dev", "lo")
	k.client.MustExec(t, "ip", "route", "add", "127.0.0.5/32", "via", scnNodeIP)
	k.client.Sysctl(t, "net.ipv4.conf.all.route_localnet", "1")
	dst := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.5"), port)
	if r, err := kerneltest.DialFrom(k.client, "tcp", addr(scnClientIP), dst, 500*time.Millisecond); err == nil {
		t.Errorf("another host reached %s on the node (%s)", dst, r.Name)
	} else if !kerneltest.IsTimeout(err) {
		t.Errorf("another host to %s: got %v, want a timeout (dropped)", dst, err)
	}
	nodeIPTables(t, k, backend, "-F", "KUBE-FIREWALL")
	if _, err := kerneltest.DialFrom(k.client, "tcp", addr(scnClientIP), dst, 3*time.Second); err != nil {
		t.Errorf("without the KUBE-FIREWALL rule, another host to %s: %v; the test cannot show the rule drops it", dst, err)
	}
}
