package shortconn_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
)

// clientEnv makes the test binary the client process (see TestMain): its
// value is "ADDR:PORT WARMUP".
const clientEnv = "PROXYKIT_SHORTCONN_CLIENT"

// timeout bounds each step of a connection (connect, write, read) at
// both ends, so that a lost packet fails the run instead of hanging it.
const timeout = 3 * time.Second

func TestMain(m *testing.M) {
	if spec := os.Getenv(clientEnv); spec != "" {
		os.Exit(runClient(spec))
	}
	os.Exit(m.Run())
}

// result is what the client process reports of its measured run.
type result struct {
	// Conns is how many connections completed, Elapsed how long they
	// took in all.
	Conns   int
	Elapsed time.Duration
	// P50 and P99 are percentiles of one connection's duration, from
	// socket(2) to close(2).
	P50, P99 time.Duration
	// Replies counts the replies by their text: the endpoint the server
	// saw the connection arrive at.
	Replies map[string]int
	// Err is the first error, which ends the run.
	Err string
}

// runClient is the client process. It makes WARMUP connections, prints
// "ready", reads a count N from its standard input, makes N connections
// and prints their result as JSON. A connection is made with blocking
// system calls on one thread, so that the process adds as little as it
// can to what the kernel does: socket, connect, write the one-line
// request, read the one-line reply, close with a reset (SO_LINGER 0), so
// that neither end keeps the connection in TIME_WAIT and the ports and
// the node's conntrack entries do not pile up over a long run.
func runClient(spec string) int {
	runtime.LockOSThread()
	var dst string
	var warm int
	if _, err := fmt.Sscan(spec, &dst, &warm); err != nil {
		fmt.Println("bad spec:", err)
		return 2
	}
	ap, err := netip.ParseAddrPort(dst)
	if err != nil || !ap.Addr().Is4() {
		fmt.Println("bad address:", dst)
		return 2
	}
	c := &client{sa: &unix.SockaddrInet4{Addr: ap.Addr().As4(), Port: int(ap.Port())}, replies: map[string]int{}}
	if err := c.run(warm, nil); err != nil {
		return report(result{Err: "warm-up: " + err.Error()})
	}
	fmt.Println("ready")
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		return report(result{Err: "reading the count: " + err.Error()})
	}
	n, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || n < 1 {
		return report(result{Err: fmt.Sprintf("bad count %q", line)})
	}
	clear(c.replies)
	lat := make([]time.Duration, 0, n)
	start := time.Now()
	err = c.run(n, &lat)
	r := result{Conns: len(lat), Elapsed: time.Since(start), Replies: c.replies}
	if err != nil {
		r.Err = err.Error()
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		r.P50, r.P99 = lat[len(lat)*50/100], lat[len(lat)*99/100]
	}
	return report(r)
}

func report(r result) int {
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		return 2
	}
	return 0
}

type client struct {
	sa      *unix.SockaddrInet4
	buf     [128]byte
	replies map[string]int
}

var request = []byte("GET\n")

// run makes n connections one after another, appending each one's
// duration to lat when lat is not nil, and stops at the first failure.
func (c *client) run(n int, lat *[]time.Duration) error {
	for i := range n {
		start := time.Now()
		reply, err := c.once()
		if err != nil {
			return fmt.Errorf("connection %d of %d: %w", i+1, n, err)
		}
		if lat != nil {
			*lat = append(*lat, time.Since(start))
		}
		c.replies[reply]++
	}
	return nil
}

func (c *client) once() (string, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	// SO_SNDTIMEO bounds connect(2) as well as write(2).
	for _, opt := range []int{unix.SO_SNDTIMEO, unix.SO_RCVTIMEO} {
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, opt, &tv); err != nil {
			return "", fmt.Errorf("setsockopt: %w", err)
		}
	}
	if err := unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1}); err != nil {
		return "", fmt.Errorf("setsockopt: %w", err)
	}
	if err := connect(fd, c.sa); err != nil {
		return "", fmt.Errorf("connect: %w", errnoName(err))
	}
	if _, err := retry(func() (int, error) { return unix.Write(fd, request) }); err != nil {
		return "", fmt.Errorf("write: %w", errnoName(err))
	}
	n := 0
	for {
		m, err := retry(func() (int, error) { return unix.Read(fd, c.buf[n:]) })
		if err != nil {
			return "", fmt.Errorf("read: %w", errnoName(err))
		}
		if m == 0 {
			return "", fmt.Errorf("reply without a newline: %q", c.buf[:n])
		}
		n += m
		if i := bytes.IndexByte(c.buf[:n], '\n'); i >= 0 {
			return string(c.buf[:i]), nil
		}
		if n == len(c.buf) {
			return "", fmt.Errorf("reply too long: %q", c.buf[:n])
		}
	}
}

// connect connects fd to sa, blocking. A signal (the Go runtime's
// own, though the client turns preemption signals off) interrupts a
// connect(2) that has a timeout with EINTR while the handshake goes on:
// then it waits for the handshake's outcome instead of connecting again.
func connect(fd int, sa unix.Sockaddr) error {
	err := unix.Connect(fd, sa)
	if !errors.Is(err, unix.EINTR) {
		return err
	}
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	for {
		n, err := unix.Poll(pfd, int(timeout.Milliseconds()))
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return err
		case n == 0:
			return unix.ETIMEDOUT
		}
		soErr, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
		if err != nil {
			return err
		}
		if soErr != 0 {
			return syscall.Errno(soErr)
		}
		return nil
	}
}

// retry repeats a read or write that a signal interrupted before it
// moved any data.
func retry(op func() (int, error)) (int, error) {
	for {
		n, err := op()
		if !errors.Is(err, unix.EINTR) {
			return n, err
		}
	}
}

// errnoName makes an errno read as its name (ECONNREFUSED), which a
// result carries as text.
func errnoName(err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return fmt.Errorf("%s (%w)", unix.ErrnoName(errno), err)
	}
	return err
}

// clientProc is a client process started by startClient, warmed up and
// waiting for its count.
type clientProc struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

// startClient starts the client process in ns and in the cgroup
// directory cgroup (placed there by clone3 before it runs, so that even
// its first connect is the cgroup's), to dst, and waits until it made
// warm connections. The process is killed when t ends if it is still
// running.
func startClient(t testing.TB, ns *kerneltest.NS, cgroup string, dst netip.AddrPort, warm int) *clientProc {
	t.Helper()
	cg, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	// No asynchronous preemption: its signals would interrupt the
	// client's blocking system calls, and nothing else runs beside the
	// client's one goroutine.
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d", clientEnv, dst, warm), "GODEBUG=asyncpreemptoff=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	cmd.Stderr = os.Stderr
	p := &clientProc{cmd: cmd}
	if p.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.out = bufio.NewReader(stdout)
	// Started from a thread inside ns, the process lives in ns.
	if err := ns.Do(cmd.Start); err != nil {
		t.Fatalf("starting the client: %v", err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	line, err := p.out.ReadString('\n')
	if err != nil || line != "ready\n" {
		var r result
		_ = json.Unmarshal([]byte(line), &r)
		t.Fatalf("client to %s did not get ready: %q %v %s", dst, line, err, r.Err)
	}
	return p
}

// measure makes the process run n connections and returns their result;
// the process then exits.
func (p *clientProc) measure(n int) (result, error) {
	var r result
	if _, err := fmt.Fprintln(p.in, n); err != nil {
		return r, err
	}
	line, err := p.out.ReadBytes('\n')
	if err != nil {
		return r, fmt.Errorf("reading the client's result: %w", err)
	}
	if err := json.Unmarshal(line, &r); err != nil {
		return r, fmt.Errorf("client's result %q: %w", line, err)
	}
	p.in.Close()
	if err := p.cmd.Wait(); err != nil {
		return r, fmt.Errorf("client: %w", err)
	}
	if r.Err != "" {
		return r, errors.New(r.Err)
	}
	return r, nil
}

// startServer serves port on every address of ns, one connection at a
// time (the client makes one at a time): it reads the one-line request,
// answers with the address the connection arrived at (the endpoint) and
// a newline, and closes. It stops when t ends.
func startServer(t testing.TB, ns *kerneltest.NS, port uint16) {
	t.Helper()
	var ln net.Listener
	if err := ns.Do(func() (err error) {
		ln, err = net.Listen("tcp4", fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
		t.Fatalf("server in %s: %v", ns.Name, err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 64)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			serve(conn, buf)
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
}

func serve(conn net.Conn, buf []byte) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	n := 0
	for bytes.IndexByte(buf[:n], '\n') < 0 {
		if n == len(buf) {
			return
		}
		m, err := conn.Read(buf[n:])
		n += m
		if err != nil && bytes.IndexByte(buf[:n], '\n') < 0 {
			return
		}
	}
	_, _ = io.WriteString(conn, conn.LocalAddr().String()+"\n")
}
