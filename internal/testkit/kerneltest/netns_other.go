//go:build !linux

package kerneltest

import (
	"errors"
	"net/netip"
	"testing"
)

var errNotLinux = errors.New("network namespaces need Linux")

// NS is a throwaway network namespace; on this platform none can be made.
type NS struct {
	// Name is the namespace's name.
	Name string
}

// Veth is a veth pair made by [Link].
type Veth struct {
	A, B string
}

func platformUnavailable() string { return "kernel tests need Linux" }

// NewNS fails t: network namespaces need Linux. [Require] skips first.
func NewNS(t testing.TB) *NS {
	t.Helper()
	t.Fatal(errNotLinux)
	return nil
}

// Do returns an error: network namespaces need Linux.
func (n *NS) Do(fn func() error) error { return errNotLinux }

// Exec returns an error: network namespaces need Linux.
func (n *NS) Exec(name string, args ...string) (string, error) { return "", errNotLinux }

// MustExec fails t: network namespaces need Linux.
func (n *NS) MustExec(t testing.TB, name string, args ...string) string {
	t.Helper()
	t.Fatal(errNotLinux)
	return ""
}

// Sysctl fails t: network namespaces need Linux.
func (n *NS) Sysctl(t testing.TB, key, value string) { t.Helper(); t.Fatal(errNotLinux) }

// Link fails t: network namespaces need Linux.
func Link(t testing.TB, a, b *NS, aAddr, bAddr netip.Prefix) Veth {
	t.Helper()
	t.Fatal(errNotLinux)
	return Veth{}
}

// AddAddr fails t: network namespaces need Linux.
func (n *NS) AddAddr(t testing.TB, ifname string, prefix netip.Prefix) {
	t.Helper()
	t.Fatal(errNotLinux)
}

// SetUp fails t: network namespaces need Linux.
func (n *NS) SetUp(t testing.TB, ifname string) { t.Helper(); t.Fatal(errNotLinux) }

// AddRoute fails t: network namespaces need Linux.
func (n *NS) AddRoute(t testing.TB, dst netip.Prefix, via netip.Addr) {
	t.Helper()
	t.Fatal(errNotLinux)
}

// AddBridge fails t: network namespaces need Linux.
func (n *NS) AddBridge(t testing.TB, name string) { t.Helper(); t.Fatal(errNotLinux) }

// AttachToBridge fails t: network namespaces need Linux.
func (n *NS) AttachToBridge(t testing.TB, ifname, bridge string) { t.Helper(); t.Fatal(errNotLinux) }

// MountCgroupAndBPF fails t: the mounts need Linux. [Require] skips
// first.
func MountCgroupAndBPF(t testing.TB) (cgroupRoot, bpffs string) {
	t.Helper()
	t.Fatal(errNotLinux)
	return "", ""
}
