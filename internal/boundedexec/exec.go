// Package boundedexec is k8s.io/utils/exec's real executor with one
// change: a command whose context ended stops waiting for its output a
// little after it is killed. os/exec kills only the process it started; a
// child that process forked (iptables-restore running modprobe, say)
// keeps the output pipes open, and without os/exec's WaitDelay, which
// k8s.io/utils/exec does not set and cannot reach, Wait waits for that
// child however long it runs (golang/go#23019), so a timeout would not end
// the call.
package boundedexec

import (
	"context"
	"errors"
	"io"
	"io/fs"
	osexec "os/exec"
	"syscall"
	"time"

	utilexec "k8s.io/utils/exec"
)

// DefaultWaitDelay is how long a killed command's Wait waits for the
// command's children to close its output, unless New is given another.
const DefaultWaitDelay = 5 * time.Second

// New returns an executor whose commands, once their context is done and
// the process killed, wait at most waitDelay for their output pipes to
// close; then the pipes are closed and Wait returns. A waitDelay of zero
// or less means DefaultWaitDelay. Errors are k8s.io/utils/exec's: an
// exit status is a utilexec.ExitError, a missing binary
// utilexec.ErrExecutableNotFound.
func New(waitDelay time.Duration) utilexec.Interface {
	if waitDelay <= 0 {
		waitDelay = DefaultWaitDelay
	}
	return executor{waitDelay: waitDelay}
}

type executor struct{ waitDelay time.Duration }

var _ utilexec.Interface = executor{}

func (e executor) Command(name string, args ...string) utilexec.Cmd {
	return e.wrap(osexec.Command(name, args...))
}

func (e executor) CommandContext(ctx context.Context, name string, args ...string) utilexec.Cmd {
	return e.wrap(osexec.CommandContext(ctx, name, args...))
}

func (e executor) LookPath(file string) (string, error) {
	path, err := osexec.LookPath(file)
	return path, convert(maskErrDot(err))
}

func (e executor) wrap(c *osexec.Cmd) utilexec.Cmd {
	c.Err = maskErrDot(c.Err)
	c.WaitDelay = e.waitDelay
	return &cmd{c}
}

// maskErrDot accepts a binary found in the current directory through a
// relative PATH entry, as k8s.io/utils/exec does.
func maskErrDot(err error) error {
	if err != nil && errors.Is(err, osexec.ErrDot) {
		return nil
	}
	return err
}

type cmd struct{ c *osexec.Cmd }

var _ utilexec.Cmd = (*cmd)(nil)

func (c *cmd) Run() error              { return convert(c.c.Run()) }
func (c *cmd) Start() error            { return convert(c.c.Start()) }
func (c *cmd) Wait() error             { return convert(c.c.Wait()) }
func (c *cmd) SetDir(dir string)       { c.c.Dir = dir }
func (c *cmd) SetStdin(in io.Reader)   { c.c.Stdin = in }
func (c *cmd) SetStdout(out io.Writer) { c.c.Stdout = out }
func (c *cmd) SetStderr(out io.Writer) { c.c.Stderr = out }
func (c *cmd) SetEnv(env []string)     { c.c.Env = env }
func (c *cmd) CombinedOutput() ([]byte, error) {
	out, err := c.c.CombinedOutput()
	return out, convert(err)
}
func (c *cmd) Output() ([]byte, error) { out, err := c.c.Output(); return out, convert(err) }

func (c *cmd) StdoutPipe() (io.ReadCloser, error) {
	r, err := c.c.StdoutPipe()
	return r, convert(err)
}

func (c *cmd) StderrPipe() (io.ReadCloser, error) {
	r, err := c.c.StderrPipe()
	return r, convert(err)
}

// Stop asks the process to end with SIGTERM, and kills it ten seconds
// later if it has not, as k8s.io/utils/exec does.
func (c *cmd) Stop() {
	p := c.c.Process
	if p == nil {
		return
	}
	_ = p.Signal(syscall.SIGTERM)
	time.AfterFunc(10*time.Second, func() { _ = p.Signal(syscall.SIGKILL) })
}

// convert turns os/exec's errors into k8s.io/utils/exec's, which callers
// test for, as k8s.io/utils/exec does: an *exec.ExitError becomes a
// utilexec.ExitError, and a binary that cannot be found or run (a path
// error from starting it) utilexec.ErrExecutableNotFound.
func convert(err error) error {
	switch e := err.(type) {
	case nil:
		return nil
	case *osexec.ExitError:
		return &utilexec.ExitErrorWrapper{ExitError: e}
	case *fs.PathError:
		return utilexec.ErrExecutableNotFound
	case *osexec.Error:
		if errors.Is(e.Err, osexec.ErrNotFound) {
			return utilexec.ErrExecutableNotFound
		}
	}
	return err
}
