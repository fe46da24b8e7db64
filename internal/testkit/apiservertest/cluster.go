package apiservertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
)

// Port is the port every API server listens on, on its own address.
const Port = 6443

// ServiceCIDR is the cluster's service IP range unless Config.ServiceCIDRs
// says otherwise: Services get their cluster IPs from it, and its first
// address is the "kubernetes" Service's.
var ServiceCIDR = netip.MustParsePrefix("10.96.0.0/16")

// etcdClientURL is where etcd serves its clients, on the loopback of the
// cluster's namespace: only the API servers and the test talk to it.
const etcdClientURL = "http://127.0.0.1:2379"

// startTimeout bounds how long etcd or an API server may take to become
// ready; an API server's first start on a busy two-core machine takes
// several seconds.
const startTimeout = 2 * time.Minute

// stopTimeout is how long a process has to exit after SIGTERM before it
// is killed.
const stopTimeout = 20 * time.Second

// Config describes a [Cluster].
type Config struct {
	// APIServers are the addresses of the namespace that one
	// kube-apiserver each listens on, on [Port]. They share one etcd, as
	// the API servers of a highly available control plane do. At least one
	// is needed.
	APIServers []netip.Addr
	// NoWatchCache runs the API servers with --watch-cache=false, so that
	// every watch is served by an etcd watch of its own: a client that
	// resumes from a resource version etcd has compacted away gets 410
	// Gone (Expired). With the watch cache (the default), the cache
	// answers, and expires what is older than its window instead.
	NoWatchCache bool
	// ServiceCIDRs are the service IP ranges, the primary family's first,
	// one or one of each family for a dual-stack cluster; empty means
	// [ServiceCIDR]. An IPv6 range may have at most 20 host bits.
	ServiceCIDRs []netip.Prefix
}

// Cluster is an etcd and one or more kube-apiservers running in a network
// namespace for the length of a test. See [Start].
type Cluster struct {
	t       testing.TB
	ns      *kerneltest.NS
	bin     string
	dir     string
	pki     *pki
	files   map[string]string
	etcd    *process
	servers []*APIServer
	http    *http.Client
	// procs are every process started, in order; stopped in reverse.
	procs []*process
}

// APIServer is one kube-apiserver of a [Cluster].
type APIServer struct {
	c *Cluster
	// Addr is its address and port: https://Addr is its URL.
	Addr netip.AddrPort
	// Name identifies it in logs ("kube-apiserver-0", ...).
	Name string
	args []string

	mu     sync.Mutex
	proc   *process
	client kubernetes.Interface
}

// Start starts etcd and the API servers of cfg in ns, with throwaway
// certificates and a service account key, and returns once every API
// server's /readyz answers ok. bin is the directory of the binaries (see
// [Require]). Everything is stopped, and its files removed, when t ends,
// whether it passed or not; the logs of the processes are printed when it
// failed. Start fails t if anything cannot be started.
func Start(t testing.TB, ns *kerneltest.NS, bin string, cfg Config) *Cluster {
	t.Helper()
	if len(cfg.APIServers) == 0 {
		t.Fatal("apiservertest: no API server address")
	}
	c := &Cluster{t: t, ns: ns, bin: bin, dir: t.TempDir()}
	c.http = &http.Client{Transport: &http.Transport{DialContext: c.dialContext}, Timeout: 10 * time.Second}
	t.Cleanup(c.stopAll)

	cidrs := cfg.ServiceCIDRs
	if len(cidrs) == 0 {
		cidrs = []netip.Prefix{ServiceCIDR}
	}
	var cidrArg []string
	for _, p := range cidrs {
		cidrArg = append(cidrArg, p.String())
	}
	var err error
	c.pki, err = newPKI(cfg.APIServers, cidrs[0].Addr().Next())
	if err != nil {
		t.Fatal(err)
	}
	if c.files, err = c.pki.write(c.dir); err != nil {
		t.Fatal(err)
	}

	c.etcd = c.start("etcd", filepath.Join(bin, "etcd"),
		"--name=test",
		"--data-dir="+filepath.Join(c.dir, "etcd"),
		"--listen-client-urls="+etcdClientURL,
		"--advertise-client-urls="+etcdClientURL,
		"--listen-peer-urls=http://127.0.0.1:2380",
		"--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=test=http://127.0.0.1:2380",
		// The data is thrown away with the test.
		"--unsafe-no-fsync",
		"--log-level=warn")
	c.waitFor("etcd", c.etcd, func(ctx context.Context) error {
		body, err := c.etcdCall(ctx, http.MethodGet, "/health", nil)
		if err == nil && !bytes.Contains(body, []byte(`"health":"true"`)) {
			err = fmt.Errorf("/health: %s", body)
		}
		return err
	})

	for i, addr := range cfg.APIServers {
		s := &APIServer{c: c, Addr: netip.AddrPortFrom(addr, Port), Name: fmt.Sprintf("kube-apiserver-%d", i)}
		certDir := filepath.Join(c.dir, s.Name)
		s.args = []string{
			"--etcd-servers=" + etcdClientURL,
			"--bind-address=" + addr.String(),
			"--advertise-address=" + addr.String(),
			"--secure-port=" + strconv.Itoa(Port),
			"--cert-dir=" + certDir,
			"--tls-cert-file=" + c.files["serving.crt"],
			"--tls-private-key-file=" + c.files["serving.key"],
			"--client-ca-file=" + c.files["ca.crt"],
			"--service-account-issuer=https://kubernetes.default.svc",
			"--service-account-key-file=" + c.files["sa.pub"],
			"--service-account-signing-key-file=" + c.files["sa.key"],
			"--service-cluster-ip-range=" + strings.Join(cidrArg, ","),
			"--authorization-mode=RBAC",
			// Only the test compacts, so that a fault test knows when a
			// resource version expires.
			"--etcd-compaction-interval=0",
			// Close watches within 2s of SIGTERM, then stop; by default
			// the server waits for them up to its request timeout (60s)
			// and a restart takes a minute.
			"--shutdown-watch-termination-grace-period=2s",
			"--profiling=false",
			"--watch-cache=" + strconv.FormatBool(!cfg.NoWatchCache),
		}
		c.servers = append(c.servers, s)
	}
	// Started one after the other: the first creates the cluster's
	// default objects, which the others would race to create too.
	for _, s := range c.servers {
		s.Start(t)
	}
	return c
}

// APIServer returns the i-th API server, in the order of
// Config.APIServers.
func (c *Cluster) APIServer(i int) *APIServer { return c.servers[i] }

// Client returns a client of the first API server as a member of
// system:masters, which may do anything. Its connections are made inside
// the cluster's namespace.
func (c *Cluster) Client() kubernetes.Interface { return c.servers[0].Client() }

// Revision returns etcd's current revision: the resource version of the
// latest write to the cluster.
func (c *Cluster) Revision(t testing.TB) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A range over one key answers with the store's revision in its header;
	// the key ("\x00") need not exist.
	body, err := c.etcdCall(ctx, http.MethodPost, "/v3/kv/range", []byte(`{"key":"AA=="}`))
	if err != nil {
		t.Fatalf("etcd revision: %v", err)
	}
	var resp struct {
		Header struct {
			Revision json.Number `json:"revision"`
		} `json:"header"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		t.Fatalf("etcd revision: %v: %s", err, body)
	}
	rev, err := resp.Header.Revision.Int64()
	if err != nil {
		t.Fatalf("etcd revision %q: %v", resp.Header.Revision, err)
	}
	return rev
}

// Compact compacts etcd's history up to its current revision and returns
// that revision: every resource version older than it is gone, and a watch
// that resumes from one is answered with 410 Gone by an API server that
// does not serve it from its watch cache (see Config.NoWatchCache).
func (c *Cluster) Compact(t testing.TB) int64 {
	t.Helper()
	rev := c.Revision(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := fmt.Sprintf(`{"revision":%d,"physical":true}`, rev)
	if _, err := c.etcdCall(ctx, http.MethodPost, "/v3/kv/compaction", []byte(req)); err != nil {
		t.Fatalf("etcd compaction at revision %d: %v", rev, err)
	}
	return rev
}

// Kubeconfig writes a kubeconfig for s as the user system:kube-proxy,
// whom the API server's default RBAC gives kube-proxy's permissions
// (the system:node-proxier role), and returns its path. The file is
// removed when the test ends.
func (s *APIServer) Kubeconfig(t testing.TB) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: "https://" + s.Addr.String(), CertificateAuthorityData: s.c.pki.ca.cert}
	cfg.AuthInfos["kube-proxy"] = &clientcmdapi.AuthInfo{ClientCertificateData: s.c.pki.kubeProxy.cert, ClientKeyData: s.c.pki.kubeProxy.key}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "kube-proxy"}
	cfg.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), s.Name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatalf("writing kubeconfig: %v", err)
	}
	return path
}

// Client returns a client of s as a member of system:masters. Its
// connections are made inside the cluster's namespace.
func (s *APIServer) Client() kubernetes.Interface {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.client
}

// Start starts s and waits until its /readyz answers ok; [Start] starts
// every API server, so this is for one that [APIServer.Stop] stopped. It
// fails t if s is running or does not become ready.
func (s *APIServer) Start(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	if s.proc != nil && !s.proc.exited() {
		s.mu.Unlock()
		t.Fatalf("%s is already running", s.Name)
	}
	s.mu.Unlock()
	cfg := &rest.Config{
		Host: "https://" + s.Addr.String(),
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   s.c.pki.ca.cert,
			CertData: s.c.pki.admin.cert,
			KeyData:  s.c.pki.admin.key,
		},
		Dial:      s.c.dialContext,
		UserAgent: "apiservertest",
		// Tests create objects in bursts; the defaults would throttle them.
		QPS:   1000,
		Burst: 1000,
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("%s: client: %v", s.Name, err)
	}
	proc := s.c.start(s.Name, filepath.Join(s.c.bin, "kube-apiserver"), s.args...)
	s.mu.Lock()
	s.proc, s.client = proc, client
	s.mu.Unlock()
	s.c.waitFor(s.Name, proc, func(ctx context.Context) error {
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("/readyz: %w: %s", err, body)
		}
		return nil
	})
}

// Stop stops s with SIGTERM, as a restart or an upgrade does, and waits
// for it to exit (killing it if it takes longer than 20s). Its clients'
// connections are closed; etcd and the other API servers keep running.
func (s *APIServer) Stop(t testing.TB) {
	t.Helper()
	proc := s.running(t)
	start := time.Now()
	proc.stop()
	t.Logf("%s stopped in %v", s.Name, time.Since(start).Round(time.Millisecond))
}

// Kill ends s with SIGKILL, as a crash or the OOM killer does, and waits
// for it: its connections are reset, with no graceful end of their
// watches.
func (s *APIServer) Kill(t testing.TB) {
	t.Helper()
	proc := s.running(t)
	if err := proc.cmd.Process.Kill(); err != nil {
		t.Fatalf("%s: kill: %v", s.Name, err)
	}
	<-proc.done
}

// Restart stops s and starts it again: [APIServer.Stop] then
// [APIServer.Start].
func (s *APIServer) Restart(t testing.TB) {
	t.Helper()
	s.Stop(t)
	s.Start(t)
}

// Pause stops s with SIGSTOP: its connections stay open and its clients'
// requests and watches hang, unanswered, as they do when a server or the
// network between stalls. [APIServer.Resume] undoes it.
func (s *APIServer) Pause(t testing.TB) {
	t.Helper()
	s.signal(t, syscall.SIGSTOP)
}

// Resume continues s after [APIServer.Pause].
func (s *APIServer) Resume(t testing.TB) {
	t.Helper()
	s.signal(t, syscall.SIGCONT)
}

func (s *APIServer) signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	proc := s.running(t)
	if err := proc.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%s: %v: %v", s.Name, sig, err)
	}
}

// running returns the process of s, failing t if it is not running.
func (s *APIServer) running(t testing.TB) *process {
	t.Helper()
	s.mu.Lock()
	proc := s.proc
	s.mu.Unlock()
	if proc == nil || proc.exited() {
		t.Fatalf("%s is not running", s.Name)
	}
	return proc
}

// dialContext makes a connection from inside the cluster's namespace,
// where its servers listen.
func (c *Cluster) dialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var conn net.Conn
	err := c.ns.Do(func() error {
		var err error
		conn, err = (&net.Dialer{}).DialContext(ctx, network, address)
		return err
	})
	return conn, err
}

// etcdCall sends one request to etcd's JSON gateway.
func (c *Cluster) etcdCall(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, etcdClientURL+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return data, fmt.Errorf("etcd %s %s: %s: %s", method, path, resp.Status, data)
	}
	return data, nil
}

// process is a server of the cluster, logging to a file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
	stopped sync.Once
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop ends p with SIGTERM (SIGCONT first, for a paused one), or SIGKILL
// after stopTimeout, and waits for it.
func (p *process) stop() {
	p.stopped.Do(func() {
		if p.exited() {
			return
		}
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(stopTimeout):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
}

// logTail returns the last lines of p's log.
func (p *process) logTail(lines int) string {
	data, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// start starts a server in the namespace, its output appended to a log
// file of the cluster's directory.
func (c *Cluster) start(name, path string, args ...string) *process {
	c.t.Helper()
	p := &process{name: name, logPath: filepath.Join(c.dir, name+".log"), done: make(chan struct{})}
	logFile, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	p.cmd = exec.Command(path, args...)
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	// Its own process group, so that a ^C of the test leaves it alone and
	// the cleanup, not the terminal, ends it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = c.ns.Do(p.cmd.Start)
	logFile.Close()
	if err != nil {
		c.t.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	c.procs = append(c.procs, p)
	return p
}

// waitFor polls ready until it succeeds, failing the test if p exits or
// startTimeout passes first.
func (c *Cluster) waitFor(what string, p *process, ready func(context.Context) error) {
	c.t.Helper()
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := ready(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-p.done:
			c.t.Fatalf("%s exited before it was ready: %v\n%s", what, p.err, p.logTail(40))
		default:
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s not ready after %v: %v\n%s", what, startTimeout, err, p.logTail(40))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stopAll stops the API servers, then etcd, and prints their logs when the
// test failed.
func (c *Cluster) stopAll() {
	var errs []error
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		p.stop()
		if p.err != nil && !isSignalExit(p.err) {
			errs = append(errs, fmt.Errorf("%s: %w", p.name, p.err))
		}
	}
	c.http.CloseIdleConnections()
	if c.t.Failed() || os.Getenv("APISERVER_LOG") != "" {
		for _, p := range c.procs {
			c.t.Logf("%s log (last lines):\n%s", p.name, p.logTail(60))
		}
	}
	if err := errors.Join(errs...); err != nil {
		c.t.Logf("servers exited with errors: %v", err)
	}
}

// isSignalExit reports whether err is the exit of a process ended by the
// signals stop sends.
func isSignalExit(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled()
}
