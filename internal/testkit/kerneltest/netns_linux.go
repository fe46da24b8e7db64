package kerneltest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// netnsDir is where named namespaces are bind-mounted, as `ip netns` does.
const netnsDir = "/run/netns"

// namePrefix starts the name of every namespace this package creates; the
// process ID follows, so that namespaces left behind by a killed test binary
// can be recognised and removed by the next run.
const namePrefix = "pk-"

var (
	nsCounter atomic.Uint64
	sweepOnce sync.Once
	probeOnce sync.Once
	probeErr  error
)

// NS is a throwaway network namespace created by [NewNS].
type NS struct {
	// Name is the namespace's name under /run/netns, as `ip netns list`
	// shows it (and as `ip netns exec NAME` accepts it).
	Name   string
	handle netns.NsHandle
}

// NewNS creates a network namespace with a unique name and its loopback up,
// and registers its deletion with t.Cleanup: the namespace is removed when
// the test ends, even if it failed or panicked. It fails t if the namespace
// cannot be made. Call [Require] first.
func NewNS(t testing.TB) *NS {
	t.Helper()
	sweepOnce.Do(sweepStale)
	name := fmt.Sprintf("%s%d-%d", namePrefix, os.Getpid(), nsCounter.Add(1))
	ns, err := newNamed(name)
	if err != nil {
		t.Fatalf("creating network namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := ns.delete(); err != nil {
			t.Errorf("deleting network namespace %s: %v", name, err)
		}
	})
	if err := ns.linkUp("lo"); err != nil {
		t.Fatalf("namespace %s: %v", name, err)
	}
	// Duplicate address detection would leave IPv6 addresses, link-local
	// ones included, unusable for a second or two after a link comes up.
	// A kernel without IPv6 has no such files; that is not an error here.
	err = ns.Do(func() error {
		for _, key := range []string{"all", "default"} {
			err := os.WriteFile("/proc/sys/net/ipv6/conf/"+key+"/accept_dad", []byte("0"), 0o644)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("namespace %s: turning off IPv6 DAD: %v", name, err)
	}
	return ns
}

func newNamed(name string) (*NS, error) {
	type result struct {
		h   netns.NsHandle
		err error
	}
	done := make(chan result, 1)
	go func() {
		// The thread that unshares is left in the new namespace; by not
		// unlocking it we make the runtime discard it when this goroutine
		// ends, so no other goroutine ever runs there by accident.
		runtime.LockOSThread()
		h, err := netns.NewNamed(name)
		done <- result{h, err}
	}()
	r := <-done
	if r.err != nil {
		return nil, r.err
	}
	return &NS{Name: name, handle: r.h}, nil
}

func (n *NS) delete() error {
	closeErr := n.handle.Close()
	if err := netns.DeleteNamed(n.Name); err != nil {
		return err
	}
	return closeErr
}

// Do runs fn on an OS thread that is inside the namespace and returns its
// error. Sockets opened and processes started (os/exec) from fn live in the
// namespace; goroutines that fn starts do not, since they run on other
// threads. A panic in fn is re-raised in the caller's goroutine.
func (n *NS) Do(fn func() error) error {
	type result struct {
		err      error
		panicked bool
		value    any
	}
	done := make(chan result, 1)
	go func() {
		// Never unlocked: the thread dies with this goroutine rather than
		// going back to the pool in the wrong namespace.
		runtime.LockOSThread()
		r := result{panicked: true}
		defer func() {
			if r.panicked {
				r.value = recover()
			}
			done <- r
		}()
		if err := netns.Set(n.handle); err != nil {
			r.panicked = false
			r.err = fmt.Errorf("entering namespace %s: %w", n.Name, err)
			return
		}
		r.err = fn()
		r.panicked = false
	}()
	r := <-done
	if r.panicked {
		panic(r.value)
	}
	return r.err
}

// Exec runs a command inside the namespace and returns its standard output.
// The error, if any, includes the command line and its standard error.
func (n *NS) Exec(name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	err := n.Do(func() error {
		cmd := exec.Command(name, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		return cmd.Run()
	})
	if err != nil {
		return stdout.String(), fmt.Errorf("netns %s: %s %s: %w: %s", n.Name, name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// MustExec is [NS.Exec] that fails t on error.
func (n *NS) MustExec(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := n.Exec(name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Sysctl writes a sysctl of the namespace, such as
// "net/ipv4/ip_forward" or "net.ipv4.conf.all.route_localnet". Only
// network (net/…) sysctls are per namespace; anything else is refused so a
// test can never change the host.
func (n *NS) Sysctl(t testing.TB, key, value string) {
	t.Helper()
	path := strings.ReplaceAll(key, ".", "/")
	if !strings.HasPrefix(path, "net/") {
		t.Fatalf("sysctl %s: only net/ sysctls are namespaced; refusing to change the host", key)
	}
	err := n.Do(func() error {
		return os.WriteFile(filepath.Join("/proc/sys", path), []byte(value), 0o644)
	})
	if err != nil {
		t.Fatalf("netns %s: sysctl %s=%s: %v", n.Name, key, value, err)
	}
}

// Netlink returns a netlink handle bound to the namespace, closed when t
// ends. Use it for links, addresses, routes, conntrack and ipsets.
func (n *NS) Netlink(t testing.TB) *netlink.Handle {
	t.Helper()
	h := n.nl(t)
	t.Cleanup(h.Close)
	return h
}

// Handle returns the namespace's file handle, for libraries that take one
// (netlink.NewHandleAt, ipvs.NewInNamespace). It stays valid until the test
// ends.
func (n *NS) Handle() netns.NsHandle { return n.handle }

func (n *NS) linkUp(name string) error {
	h, err := netlink.NewHandleAt(n.handle)
	if err != nil {
		return err
	}
	defer h.Close()
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("setting %s up: %w", name, err)
	}
	return nil
}

// sweepStale removes namespaces that an earlier test binary created and
// could not delete because it was killed: their names carry a process ID
// that no longer exists. Namespaces of live processes are left alone.
func sweepStale() {
	entries, err := os.ReadDir(netnsDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), namePrefix)
		if !ok {
			continue
		}
		pidText, _, ok := strings.Cut(rest, "-")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = netns.DeleteNamed(e.Name())
		}
	}
}

func platformUnavailable() string {
	if os.Geteuid() != 0 {
		return "not running as root"
	}
	probeOnce.Do(func() {
		name := fmt.Sprintf("%sprobe%d", namePrefix, os.Getpid())
		ns, err := newNamed(name)
		if err != nil {
			probeErr = err
			return
		}
		probeErr = ns.delete()
	})
	if probeErr != nil {
		return "cannot create a network namespace: " + probeErr.Error()
	}
	return ""
}
