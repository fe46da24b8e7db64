package main

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	cebpf "github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
	"github.com/proxykit/proxykit/iptables"
)

// socketClientEnv makes the test binary a client process (see init):
// its value is "ADDR:PORT COUNT".
const socketClientEnv = "PROXYKIT_E2E_SOCKET_CLIENT"

// init runs the client before the tests when the test binary is
// re-executed as one, so that the process is in the cgroup it was
// cloned into from its first instruction.
func init() {
	if spec := os.Getenv(socketClientEnv); spec != "" {
		os.Exit(runSocketClient(spec))
	}
}

// runSocketClient connects COUNT times over TCP and prints one line per
// attempt: the backend's name, the peer address getpeername gives and
// the remote address the kernel's socket really has (from
// /proc/net/tcp), or "error ERRNO". A socket the socket load balancer
// translated has an endpoint as its remote address and the Service as its
// peer; one that nftables NATs has the Service as both.
func runSocketClient(spec string) int {
	var addr string
	var count int
	if _, err := fmt.Sscan(spec, &addr, &count); err != nil {
		fmt.Println("bad spec:", err)
		return 2
	}
	for range count {
		line, err := socketClientOnce(addr)
		if err != nil {
			var errno syscall.Errno
			if errors.As(err, &errno) {
				line = "error " + unix.ErrnoName(errno)
			} else {
				line = "error " + err.Error()
			}
		}
		fmt.Println(line)
	}
	return 0
}

func socketClientOnce(addr string) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	real, err := tcpRemote(conn.LocalAddr().(*net.TCPAddr).AddrPort())
	if err != nil {
		return "", err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s %s %s", strings.Fields(line)[0], conn.RemoteAddr(), real), nil
}

// tcpRemote finds the socket of local in /proc/net/tcp, or tcp6 for an
// IPv6 one (of the process's network namespace), and returns its remote
// address.
func tcpRemote(local netip.AddrPort) (netip.AddrPort, error) {
	file := "/proc/net/tcp"
	if local.Addr().Is6() {
		file = "/proc/net/tcp6"
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return netip.AddrPort{}, err
	}
	for line := range strings.Lines(string(data)) {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		l, err1 := procAddr(f[1])
		r, err2 := procAddr(f[2])
		if err1 == nil && err2 == nil && l == local {
			return r, nil
		}
	}
	return netip.AddrPort{}, fmt.Errorf("no socket of %s in %s", local, file)
}

// procAddr parses /proc/net/tcp's "0100007F:1F90" (the address in host
// byte order, little-endian here, and the port), or tcp6's, whose address
// is four such 32-bit words.
func procAddr(s string) (netip.AddrPort, error) {
	a, p, ok := strings.Cut(s, ":")
	b, err := hex.DecodeString(a)
	if !ok || err != nil || (len(b) != 4 && len(b) != 16) {
		return netip.AddrPort{}, fmt.Errorf("bad address %q", s)
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, err
	}
	for w := 0; w < len(b); w += 4 {
		b[w], b[w+1], b[w+2], b[w+3] = b[w+3], b[w+2], b[w+1], b[w]
	}
	addr, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(addr, uint16(port)), nil
}

// socketClient runs the client in the node's network namespace, in
// cgroup when it is not "" (placed there by clone3 before it runs), and
// returns its lines.
func (k *e2eNode) socketClient(t *testing.T, cgroup, to string, count int) []string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d", socketClientEnv, to, count))
	if cgroup != "" {
		cg, err := os.Open(cgroup)
		if err != nil {
			t.Fatal(err)
		}
		defer cg.Close()
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	}
	var out []byte
	if err := k.node.Do(func() error {
		var err error
		out, err = cmd.Output()
		return err
	}); err != nil {
		t.Fatalf("client: %v", err)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// TestE2EEBPFScenarios runs TestE2E's scenarios in ebpf mode. They send
// from outside the node (the client and pod namespaces), so nftables mode
// beside the socket load balancer serves them.
func TestE2EEBPFScenarios(t *testing.T) {
	m := e2eMode{"ebpf", modeEBPF, iptables.BackendNFT}
	kerneltest.Require(t, m.tools(false)...)
	testE2E(t, m)
}

// TestE2EEBPF runs the proxier in ebpf mode in a node namespace, with its
// programs attached to a cgroup the test makes in a cgroup2 mount of its
// own and its maps pinned on a bpffs of its own: a process of that cgroup
// on the node reaches a cluster IP's endpoints by socket translation
// (its socket's remote address is the endpoint's), and is refused at once
// by a Service without endpoints; a process of another cgroup still
// reaches the cluster IP through nftables' NAT; a node port and a cluster
// IP reached from outside the node are served by nftables mode beside it;
// --cleanup after SIGTERM leaves nothing pinned.
func TestE2EEBPF(t *testing.T) {
	kerneltest.Require(t, append(e2eTools(iptables.BackendNFT), "nft")...)
	k := newE2ENode(t, iptables.BackendNFT, e2eScenario(), false)
	k.mode = modeEBPF
	var cgroup, bpffs string
	k.extraArgs, cgroup, bpffs = ebpfE2EArgs(t)
	k.start(k.proxierArgs()...)

	// Translated at connect: the socket's remote is an endpoint.
	endpoints := map[string]string{"pod-a": "10.244.0.11:8080", "pod-b": "10.244.0.12:8080"}
	check(t, checkTranslated(k.socketClient(t, cgroup, "10.96.0.10:80", 20), "10.96.0.10:80", endpoints))
	// No endpoints: refused by the program.
	if got := k.socketClient(t, cgroup, "10.96.0.17:80", 1); !slices.Equal(got, []string{"error ECONNREFUSED"}) {
		t.Errorf("client in the cgroup to a Service without endpoints: %q, want ECONNREFUSED", got)
	}
	// Outside the cgroup: nftables' NAT, the socket keeps the Service.
	for _, line := range k.socketClient(t, "", "10.96.0.10:80", 5) {
		if f := strings.Fields(line); len(f) != 3 || endpoints[f[0]] == "" || f[1] != "10.96.0.10:80" || f[2] != "10.96.0.10:80" {
			t.Errorf("client outside the cgroup: %q, want \"POD 10.96.0.10:80 10.96.0.10:80\" (NATed by nftables)", line)
		}
	}
	// From outside the node: nftables mode.
	check(t, k.reaches("tcp", e2eNodeIP, 30080, 20, "pod-a", "pod-b"))
	check(t, k.reaches("tcp", "10.96.0.10", 80, 20, "pod-a", "pod-b"))
	check(t, k.refused("tcp", e2eClientIP, "10.96.0.17", 80))

	k.terminate(t)
	if got := pinned(t, bpffs); len(got) == 0 {
		t.Errorf("after SIGTERM, nothing is pinned; want the maps and links to stay for the next proxier")
	}
	// --cleanup needs no cgroup: the pins name what to detach.
	if err := k.runProxier("--cleanup", "--mode", "ebpf", "--ebpf-pin-path", bpffs, "--ebpf-name-prefix", "e2e"); err != nil {
		t.Fatalf("--cleanup: %v\n%s", err, k.log.String())
	}
	if got := pinned(t, bpffs); len(got) != 0 {
		t.Errorf("after --cleanup, the bpffs holds %v, want nothing of the proxier's", got)
	}
	if got := k.socketClient(t, cgroup, "10.96.0.10:80", 1); len(got) != 1 || !strings.HasPrefix(got[0], "error ") {
		t.Errorf("client in the cgroup after --cleanup: %q, want an error (nothing serves the cluster IP)", got)
	}
}

// pinned lists what the proxier pinned on bpffs (the names starting
// with the test's prefix; a bpffs also shows the kernel's own iterators).
func pinned(t *testing.T, bpffs string) []string {
	t.Helper()
	entries, err := os.ReadDir(bpffs)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "e2e_") {
			out = append(out, e.Name())
		}
	}
	return out
}

// checkTranslated checks the client's lines for to: each a connection
// the socket load balancer translated to one of endpoints (by pod name),
// and every endpoint reached.
func checkTranslated(lines []string, to string, endpoints map[string]string) error {
	seen := map[string]bool{}
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) != 3 || endpoints[f[0]] == "" || f[1] != to || f[2] != endpoints[f[0]] {
			return fmt.Errorf("client in the cgroup: %q, want \"POD %s POD-ADDR:8080\" (peer the Service, remote the endpoint)", line, to)
		}
		seen[f[0]] = true
	}
	if len(seen) != len(endpoints) {
		return fmt.Errorf("client in the cgroup to %s reached %v, want each of %v", to, seen, endpoints)
	}
	return nil
}

// TestE2EEBPFDualStack runs ebpf mode on a dual-stack node: one process
// of the cgroup reaches a dual-stack Service's IPv6 cluster IP and its
// IPv4 one, each translated at connect to the endpoints of its family,
// and an IPv6-only Service's; from outside the node, nftables mode beside
// it serves the IPv6 cluster IP.
func TestE2EEBPFDualStack(t *testing.T) {
	m := e2eMode{"ebpf", modeEBPF, iptables.BackendNFT}
	kerneltest.Require(t, m.tools(true)...)
	c := e2eDualStackCluster(e2eService{name: "only6", ports: e2eTCP, pods6: []string{"pod-c"},
		spec: "  clusterIP: \"fd00:96::11\"\n  clusterIPs: [\"fd00:96::11\"]\n  ipFamilies: [IPv6]\n  ports: [{name: http, port: 80, targetPort: 8080, protocol: TCP}]\n"})
	k := newE2EModeNode(t, m, c, true)
	k.start(k.proxierArgs("--cluster-cidr", e2eClusterCIDR+",fd00:244::/64")...)

	for _, tc := range []struct {
		to        string
		endpoints map[string]string
	}{
		{"[fd00:96::10]:80", map[string]string{"pod-a": "[fd00:244::11]:8080", "pod-b": "[fd00:244::12]:8080"}},
		{"10.96.0.10:80", map[string]string{"pod-a": "10.244.0.11:8080", "pod-b": "10.244.0.12:8080"}},
		{"[fd00:96::11]:80", map[string]string{"pod-c": "[fd00:244::13]:8080"}},
	} {
		// The IPv6 groups may sync after the IPv4 one start waits for.
		k.eventually(10*time.Second, "the cgroup's client to "+tc.to, func() error {
			return checkTranslated(k.socketClient(t, k.cgroup, tc.to, 20), tc.to, tc.endpoints)
		})
	}
	got := map[string]int{}
	for range 20 {
		r, err := kerneltest.Dial(k.client, "tcp", netip.MustParseAddrPort("[fd00:96::10]:80"), 2*time.Second)
		if err != nil {
			t.Fatalf("tcp from outside the node to [fd00:96::10]:80: %v", err)
		}
		got[r.Name]++
	}
	if len(got) != 2 || got["pod-a"] == 0 || got["pod-b"] == 0 {
		t.Errorf("tcp from outside the node to [fd00:96::10]:80 reached %v, want pod-a and pod-b", got)
	}
}

// TestE2EEBPFOnceAndCleanup runs TestE2EOnceAndCleanup in ebpf mode: after
// --once, a process of the cgroup is translated at connect by programs
// that outlive the proxier; --cleanup leaves the tables as they were,
// nothing pinned, no program on the cgroup's hooks, and none of the
// programs and maps --once loaded in the kernel.
func TestE2EEBPFOnceAndCleanup(t *testing.T) {
	m := e2eMode{"ebpf", modeEBPF, iptables.BackendNFT}
	kerneltest.Require(t, m.tools(false)...)
	var progs []cebpf.ProgramID
	var maps []cebpf.MapID
	testE2EOnceAndCleanup(t, m, func(t *testing.T, k *e2eNode, cleaned bool) {
		if !cleaned {
			check(t, checkTranslated(k.socketClient(t, k.cgroup, "10.96.0.10:80", 20), "10.96.0.10:80",
				map[string]string{"pod-a": "10.244.0.11:8080", "pod-b": "10.244.0.12:8080"}))
			if got := pinned(t, k.bpffs); len(got) == 0 {
				t.Errorf("after --once, nothing is pinned; want the maps and links to stay")
			}
			progs, maps = cgroupPrograms(t, k.cgroup)
			if len(progs) == 0 || len(maps) == 0 {
				t.Fatalf("after --once, %d programs on the cgroup's hooks using %d maps, want some", len(progs), len(maps))
			}
			return
		}
		if got := pinned(t, k.bpffs); len(got) != 0 {
			t.Errorf("after --cleanup, the bpffs holds %v, want nothing of the proxier's", got)
		}
		if now, _ := cgroupPrograms(t, k.cgroup); len(now) != 0 {
			t.Errorf("after --cleanup, programs %v on the cgroup's hooks, want none", now)
		}
		// The kernel frees an object once its last reference is gone,
		// a moment after the detach.
		k.eventually(10*time.Second, "the programs and maps freed", func() error {
			var left []string
			for _, id := range progs {
				if p, err := cebpf.NewProgramFromID(id); err == nil {
					p.Close()
					left = append(left, fmt.Sprintf("program %d", id))
				}
			}
			for _, id := range maps {
				if m, err := cebpf.NewMapFromID(id); err == nil {
					m.Close()
					left = append(left, fmt.Sprintf("map %d", id))
				}
			}
			if len(left) > 0 {
				return fmt.Errorf("still in the kernel: %v", left)
			}
			return nil
		})
		if got := k.socketClient(t, k.cgroup, "10.96.0.10:80", 1); len(got) != 1 || !strings.HasPrefix(got[0], "error ") {
			t.Errorf("client in the cgroup after --cleanup: %q, want an error (nothing serves the cluster IP)", got)
		}
	})
}

// cgroupPrograms returns the ids of the programs attached to cgroup on
// the socket load balancer's hooks, and of the maps they use.
func cgroupPrograms(t *testing.T, cgroup string) ([]cebpf.ProgramID, []cebpf.MapID) {
	t.Helper()
	f, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var progs []cebpf.ProgramID
	var maps []cebpf.MapID
	for _, at := range []cebpf.AttachType{
		cebpf.AttachCGroupInet4Connect, cebpf.AttachCGroupUDP4Sendmsg, cebpf.AttachCGroupUDP4Recvmsg, cebpf.AttachCgroupInet4GetPeername,
		cebpf.AttachCGroupInet6Connect, cebpf.AttachCGroupUDP6Sendmsg, cebpf.AttachCGroupUDP6Recvmsg, cebpf.AttachCgroupInet6GetPeername,
	} {
		r, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: at})
		if err != nil {
			t.Fatalf("querying %s: %v", at, err)
		}
		for _, p := range r.Programs {
			progs = append(progs, p.ID)
			prog, err := cebpf.NewProgramFromID(p.ID)
			if err != nil {
				t.Fatal(err)
			}
			info, err := prog.Info()
			prog.Close()
			if err != nil {
				t.Fatal(err)
			}
			ids, _ := info.MapIDs()
			for _, id := range ids {
				if !slices.Contains(maps, id) {
					maps = append(maps, id)
				}
			}
		}
	}
	return progs, maps
}
