package kernel

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"k8s.io/utils/exec"

	"github.com/proxykit/proxykit/internal/boundedexec"
)

// ErrNotSupported is wrapped by the error returned when the real root ("/")
// is read on an operating system that is not Linux; the error names the
// operating system. A Kernel with another Root works on every platform,
// which is what tests use. Callers test for it with [IsNotSupported].
var ErrNotSupported = errors.New("kernel: not supported")

// IsNotSupported reports whether err, or an error it wraps, is
// [ErrNotSupported].
func IsNotSupported(err error) bool {
	return errors.Is(err, ErrNotSupported)
}

// Kernel reads facts about the kernel from files under Root and loads
// modules by running modprobe through Exec.
//
// The zero value reads the real root and never runs modprobe. A Kernel keeps
// no state between calls: every method reads the files again, so it sees
// modules loaded since the last call. It is safe for concurrent use if Exec
// is.
type Kernel struct {
	// Root is the directory that stands for "/": /proc, /sys, /boot and
	// /lib/modules are looked up under it. Empty means "/".
	Root string
	// Exec runs modprobe for a module that is neither loaded nor built
	// in. Nil means modules are never loaded, only looked up.
	Exec exec.Interface
	// ModprobeTimeout bounds each modprobe: when it passes, modprobe is
	// killed (Exec must honour the context, as the real one does) and the
	// module counts as missing. Zero means DefaultModprobeTimeout; a
	// negative value means no bound.
	ModprobeTimeout time.Duration
}

// DefaultModprobeTimeout is how long a modprobe may run when
// Kernel.ModprobeTimeout is zero. Loading a module takes milliseconds; a
// modprobe that takes a minute is stuck (on a hung module's init, say),
// and waiting longer would hold up the proxier's start for nothing.
const DefaultModprobeTimeout = time.Minute

// New returns a Kernel for this node: the real root and the real exec.
func New() *Kernel {
	return &Kernel{Root: "/", Exec: boundedexec.New(0)}
}

// path returns the path of the absolute path p under k.Root, or
// an error wrapping ErrNotSupported for the host root on a platform that is
// not Linux.
func (k *Kernel) path(p string) (string, error) {
	root := k.Root
	if root == "" {
		root = "/"
	}
	if !hostIsLinux && filepath.Clean(root) == string(filepath.Separator) {
		return "", fmt.Errorf("%w on %s: the host kernel can only be read on Linux", ErrNotSupported, runtime.GOOS)
	}
	return filepath.Join(root, filepath.FromSlash(p)), nil
}

// readFile reads the file at absolute path p under k.Root. Errors name p as
// the node sees it (not the root-prefixed path) and wrap the cause, so
// errors.Is(err, fs.ErrNotExist) works.
func (k *Kernel) readFile(p string) ([]byte, error) {
	full, err := k.path(p)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(full)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", p, unwrapPathError(err))
	}
	return data, nil
}

// unwrapPathError drops the *fs.PathError around err, whose path would be
// the root-prefixed one; the caller names the path itself.
func unwrapPathError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// validRelPath reports whether p is a relative slash-separated path that
// stays below the directory it is joined to: no empty, "." or ".."
// elements.
func validRelPath(p string) bool {
	if p == "" || strings.HasPrefix(p, "/") {
		return false
	}
	for _, part := range strings.Split(p, "/") {
		if part == "" || part == "." || part == ".." {
			return false
		}
	}
	return true
}
