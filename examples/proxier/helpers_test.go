package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	"sigs.k8s.io/knftables"
	"sigs.k8s.io/yaml"

	"github.com/proxykit/proxykit/ebpf"
	"github.com/proxykit/proxykit/internal/testkit/golden"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvsmode"
)

// demoCommand is the README's first command. The demo cluster's header
// comment and the golden test use it too. demoIPVSCommand is the same in
// IPVS mode and in nftables mode, which the example's README shows.
const (
	demoCommand         = "go run ./examples/proxier --manifests examples/proxier/testdata --dry-run --hostname-override node-a"
	demoIPVSCommand     = demoCommand + " --mode ipvs"
	demoNFTablesCommand = demoCommand + " --mode nftables"
	// demoEBPFCommand is ebpf mode's, which the tests run but the
	// READMEs do not show.
	demoEBPFCommand = demoCommand + " --mode ebpf"
)

// testLogger returns a context whose logger writes to buf, at verbosity v.
func testLogger(buf *logBuffer, v int) context.Context {
	return klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(buf), textlogger.Verbosity(v))))
}

// logBuffer collects the log lines of goroutines that log at once.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// dryRunEnvironment is the real environment with every part a dry run must
// not use replaced by one that fails t: no iptables, no conntrack, no
// kernel files, no IPVS, and no host addresses (the node's come from its
// Node object).
func dryRunEnvironment(t *testing.T, stdout io.Writer) *environment {
	env := realEnvironment(stdout)
	env.DetectBackend = func(context.Context) (iptables.Backend, error) {
		t.Error("a dry run detected the iptables backend")
		return "", fmt.Errorf("not in a dry run")
	}
	env.NewIPTables = func(context.Context, v1.IPFamily, iptables.Backend) (iptables.Interface, error) {
		t.Error("a dry run made an iptables Interface")
		return nil, fmt.Errorf("not in a dry run")
	}
	env.Conntrack = nil
	env.Kernel = nil
	env.OpenIPVS = func(context.Context, bool) (*ipvsmode.Handles, error) {
		t.Error("a dry run opened IPVS")
		return nil, fmt.Errorf("not in a dry run")
	}
	env.NewNFTables = func(context.Context, knftables.Family, string) (knftables.Interface, error) {
		t.Error("a dry run made an nftables Interface")
		return nil, fmt.Errorf("not in a dry run")
	}
	env.OpenEBPF = func(ebpf.DatapathConfig) (ebpf.Maps, error) {
		t.Error("a dry run loaded the socket load balancer")
		return nil, fmt.Errorf("not in a dry run")
	}
	env.CleanupEBPF = func(ebpf.DatapathConfig) (bool, error) {
		t.Error("a dry run removed the socket load balancer")
		return false, fmt.Errorf("not in a dry run")
	}
	env.HostAddresses = func() ([]netip.Addr, error) {
		t.Error("a dry run read the host's addresses")
		return nil, fmt.Errorf("not in a dry run")
	}
	env.Listen = nil
	return env
}

// runArgs parses args and runs the proxier in this process with env; it
// returns what was logged and run's error.
func runArgs(t *testing.T, env *environment, args ...string) (string, error) {
	t.Helper()
	o, err := parseOptions(args, io.Discard)
	if err != nil {
		t.Fatalf("parsing %q: %v", args, err)
	}
	var log logBuffer
	err = run(testLogger(&log, 2), o, env)
	return log.String(), err
}

// checkGolden compares got with testdata/name, or rewrites the file with
// -update.
func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	golden.Check(t, filepath.Join("testdata", name), got)
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// commandEnv names a proxier built beforehand, as the VM tier does: it has
// no Go toolchain to build one.
const commandEnv = "PROXYKIT_TEST_COMMAND"

// proxierBinary returns the path of the proxier: $PROXYKIT_TEST_COMMAND
// when set, or else one built once per test process, into a directory
// removed by TestMain.
func proxierBinary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv(commandEnv); bin != "" {
		return bin
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "proxier-test-")
		if buildErr != nil {
			return
		}
		// Readable by everyone: the no-privilege test runs it as nobody.
		if buildErr = os.Chmod(buildDir, 0o755); buildErr != nil {
			return
		}
		// go test puts its own go command first in PATH.
		cmd := exec.Command("go", "build", "-o", filepath.Join(buildDir, "proxier"), ".")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(buildDir, "proxier")
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// manifestChunk returns Services from to to with their EndpointSlices
// (svcs[i] and eps[i] belong together) as one --manifests file: each
// object a YAML document after a "---" line.
func manifestChunk(tb testing.TB, svcs []*v1.Service, eps []*discoveryv1.EndpointSlice, from, to int) []byte {
	tb.Helper()
	var buf bytes.Buffer
	for i := from; i < to; i++ {
		for _, o := range []any{svcs[i], eps[i]} {
			y, err := yaml.Marshal(o)
			if err != nil {
				tb.Fatal(err)
			}
			buf.WriteString("---\n")
			buf.Write(y)
		}
	}
	return buf.Bytes()
}
