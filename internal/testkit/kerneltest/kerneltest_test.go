package kerneltest

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// netnsList returns the names `ip netns list` prints.
func netnsList(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatalf("ip netns list: %v", err)
	}
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names
}

func TestClientReachesBackendOverVeth(t *testing.T) {
	Require(t, "ip")
	var created []string
	t.Run("traffic", func(t *testing.T) {
		client, server := NewNS(t), NewNS(t)
		created = []string{client.Name, server.Name}
		for _, name := range created {
			if !slices.Contains(netnsList(t), name) {
				t.Fatalf("ip netns list does not show %s while it exists", name)
			}
		}
		v := Link(t, client, server, netip.MustParsePrefix("10.1.0.1/24"), netip.MustParsePrefix("10.1.0.2/24"))
		client.AddAddr(t, v.A, netip.MustParsePrefix("fd00:1::1/64"))
		server.AddAddr(t, v.B, netip.MustParsePrefix("fd00:1::2/64"))
		StartBackend(t, server, "backend-a", 8080)

		for _, tc := range []struct {
			network string
			dst     string
			client  string
		}{
			{"tcp", "10.1.0.2:8080", "10.1.0.1"},
			{"udp", "10.1.0.2:8080", "10.1.0.1"},
			{"tcp", "[fd00:1::2]:8080", "fd00:1::1"},
			{"udp", "[fd00:1::2]:8080", "fd00:1::1"},
		} {
			got, err := Dial(client, tc.network, netip.MustParseAddrPort(tc.dst), 5*time.Second)
			if err != nil {
				t.Fatalf("%s to %s: %v", tc.network, tc.dst, err)
			}
			want := Reply{Name: "backend-a", Client: netip.MustParseAddr(tc.client)}
			if got != want {
				t.Errorf("%s to %s: got %+v, want %+v", tc.network, tc.dst, got, want)
			}
		}

		// A port nobody listens on is refused at once, for TCP by a reset
		// and for UDP by ICMP port unreachable.
		for _, network := range []string{"tcp", "udp"} {
			_, err := Dial(client, network, netip.MustParseAddrPort("10.1.0.2:9"), 5*time.Second)
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("%s to a closed port: got %v, want connection refused", network, err)
			}
		}

		// The client namespace is really separate: the backend is not
		// reachable from the test's own namespace, and commands run with
		// Exec see only the namespace's links.
		out := client.MustExec(t, "ip", "-o", "link", "show")
		if !strings.Contains(out, v.A) || strings.Contains(out, v.B) {
			t.Errorf("ip link in %s shows the wrong links:\n%s", client.Name, out)
		}
	})
	if len(created) != 2 {
		t.Fatal("subtest did not create its namespaces")
	}
	left := netnsList(t)
	for _, name := range created {
		if slices.Contains(left, name) {
			t.Errorf("namespace %s left behind after the test ended: %v", name, left)
		}
		if _, err := os.Stat(netnsDir + "/" + name); !os.IsNotExist(err) {
			t.Errorf("%s/%s still exists (err=%v)", netnsDir, name, err)
		}
	}
}

func TestBackendStopRefuses(t *testing.T) {
	Require(t)
	client, server := NewNS(t), NewNS(t)
	Link(t, client, server, netip.MustParsePrefix("10.2.0.1/24"), netip.MustParsePrefix("10.2.0.2/24"))
	b := StartBackend(t, server, "b", 8080)
	dst := netip.MustParseAddrPort("10.2.0.2:8080")
	if _, err := Dial(client, "tcp", dst, 5*time.Second); err != nil {
		t.Fatalf("before Stop: %v", err)
	}
	b.Stop()
	b.Stop() // idempotent
	if _, err := Dial(client, "tcp", dst, 5*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("after Stop: got %v, want connection refused", err)
	}
}

func TestSysctlIsPerNamespace(t *testing.T) {
	Require(t)
	ns := NewNS(t)
	hostBefore, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	want := "1"
	if strings.TrimSpace(string(hostBefore)) == "1" {
		want = "0"
	}
	ns.Sysctl(t, "net.ipv4.ip_forward", want)
	var got []byte
	if err := ns.Do(func() (err error) {
		got, err = os.ReadFile("/proc/sys/net/ipv4/ip_forward")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(got)) != want {
		t.Errorf("ip_forward in %s = %q, want %q", ns.Name, got, want)
	}
	hostAfter, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if string(hostAfter) != string(hostBefore) {
		t.Errorf("host ip_forward changed from %q to %q", hostBefore, hostAfter)
	}
}

func TestDoRepanicsInCaller(t *testing.T) {
	Require(t)
	ns := NewNS(t)
	defer func() {
		if r := recover(); r != "boom" {
			t.Errorf("recovered %v, want boom", r)
		}
	}()
	_ = ns.Do(func() error { panic("boom") })
	t.Error("Do returned after fn panicked")
}

// TestCleanupAfterPanic runs a test that creates a namespace and panics, in a
// child process, and checks that the namespace is gone afterwards.
func TestCleanupAfterPanic(t *testing.T) {
	Require(t)
	if os.Getenv("KERNELTEST_PANIC_CHILD") == "1" {
		ns := NewNS(t)
		fmt.Printf("NAMESPACE=%s\n", ns.Name)
		panic("deliberate panic with a namespace open")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCleanupAfterPanic$", "-test.v")
	cmd.Env = append(os.Environ(), "KERNELTEST_PANIC_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("child test did not fail:\n%s", out)
	}
	_, rest, ok := strings.Cut(string(out), "NAMESPACE=")
	if !ok {
		t.Fatalf("child did not create a namespace:\n%s", out)
	}
	name, _, _ := strings.Cut(rest, "\n")
	if !strings.Contains(string(out), "deliberate panic") {
		t.Fatalf("child did not panic as planned:\n%s", out)
	}
	if slices.Contains(netnsList(t), name) {
		t.Errorf("namespace %s left behind by a panicking test", name)
	}
}

// fakeTB records how Require ended a test.
type fakeTB struct {
	testing.TB
	skipped, failed string
}

func (f *fakeTB) Helper()                          {}
func (f *fakeTB) Skipf(format string, args ...any) { f.skipped = fmt.Sprintf(format, args...) }
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
}

func TestRequireSkipsOrFails(t *testing.T) {
	const missing = "no-such-tool-proxykit"
	for _, tc := range []struct {
		env        string
		wantSkip   bool
		wantFailed bool
	}{
		{env: "", wantSkip: true},
		{env: "0", wantSkip: true},
		{env: "1", wantFailed: true},
	} {
		t.Run("env="+tc.env, func(t *testing.T) {
			t.Setenv(RequireKernelEnv, tc.env)
			f := &fakeTB{TB: t}
			Require(f, missing)
			if (f.skipped != "") != tc.wantSkip || (f.failed != "") != tc.wantFailed {
				t.Fatalf("skipped=%q failed=%q, want skip=%v fail=%v", f.skipped, f.failed, tc.wantSkip, tc.wantFailed)
			}
			msg := f.skipped + f.failed
			if !strings.Contains(msg, "not found") && !strings.Contains(msg, "root") && !strings.Contains(msg, "Linux") {
				t.Errorf("message does not say why: %q", msg)
			}
		})
	}
}

// TestRequireVM: outside the VM tier a VM test skips even when kernel
// tests are required; inside, a missing tool fails it.
func TestRequireVM(t *testing.T) {
	const missing = "no-such-tool-proxykit"
	for _, tc := range []struct {
		vm                   string
		wantSkip, wantFailed bool
	}{
		{vm: "", wantSkip: true},
		{vm: "1", wantFailed: true},
	} {
		t.Run("vm="+tc.vm, func(t *testing.T) {
			t.Setenv(RequireKernelEnv, "1")
			t.Setenv(VMEnv, tc.vm)
			f := &fakeTB{TB: t}
			RequireVM(f, missing)
			if (f.skipped != "") != tc.wantSkip || (f.failed != "") != tc.wantFailed {
				t.Fatalf("skipped=%q failed=%q, want skip=%v fail=%v", f.skipped, f.failed, tc.wantSkip, tc.wantFailed)
			}
		})
	}
}

// TestProxyNetwork: the client reaches every pod through the node in both
// families, from its own address, and an address nothing serves leads
// nowhere.
func TestProxyNetwork(t *testing.T) {
	Require(t)
	p := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	n := NewProxyNetwork(t, ProxyNetworkConfig{
		ClientAddrs: []netip.Prefix{p("10.1.0.2/24"), p("10.1.0.3/24"), p("fd00:1::2/64")},
		NodeAddrs:   []netip.Prefix{p("10.1.0.1/24"), p("fd00:1::1/64")},
		BridgeAddrs: []netip.Prefix{p("10.244.0.1/24"), p("fd00:244::1/64")},
		Pods: []NetworkPod{
			{Name: "pod-a", Addrs: []netip.Prefix{p("10.244.0.11/24"), p("fd00:244::11/64")}},
			{Name: "pod-b", Addrs: []netip.Prefix{p("10.244.0.12/24")}},
		},
		BackendPort: 8080,
	})
	for _, tc := range []struct{ dst, name, client string }{
		{"10.244.0.11:8080", "pod-a", "10.1.0.2"},
		{"[fd00:244::11]:8080", "pod-a", "fd00:1::2"},
		{"10.244.0.12:8080", "pod-b", "10.1.0.2"},
		{"10.1.0.1:8080", "", ""},
	} {
		got, err := Dial(n.Client, "tcp", netip.MustParseAddrPort(tc.dst), 2*time.Second)
		if tc.name == "" {
			if err == nil {
				t.Errorf("tcp to %s reached %s, want nothing", tc.dst, got.Name)
			}
			continue
		}
		if want := (Reply{Name: tc.name, Client: netip.MustParseAddr(tc.client)}); err != nil || got != want {
			t.Errorf("tcp to %s: %+v, %v; want %+v", tc.dst, got, err, want)
		}
	}
	if len(n.Pods) != 2 || n.ClientLink == "" || n.NodeLink == "" {
		t.Errorf("network %+v", n)
	}
	if _, err := Dial(n.Client, "tcp", netip.MustParseAddrPort("192.0.2.1:80"), 500*time.Millisecond); !IsTimeout(err) {
		t.Errorf("tcp to an address nothing serves: %v, want a timeout", err)
	}
}
