package boundedexec

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	utilexec "k8s.io/utils/exec"
)

// TestKilledCommandWithChild runs a shell whose child holds its output
// open for a minute, and kills the shell through the context: Run must
// return soon after the wait delay, not after the child.
func TestKilledCommandWithChild(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	c := New(100*time.Millisecond).CommandContext(ctx, "/bin/sh", "-c", "sleep 60; echo late")
	var out bytes.Buffer
	c.SetStdout(&out)
	done := make(chan error, 1)
	go func() { done <- c.Run() }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a killed command succeeded")
		}
		var ee utilexec.ExitError
		if errors.As(err, &ee) && ee.Exited() {
			t.Errorf("error %v says the command exited, want killed", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run still waits for the killed command's child")
	}
}

// TestErrors checks that errors come back as k8s.io/utils/exec's.
func TestErrors(t *testing.T) {
	e := New(0)
	if _, err := e.LookPath("proxykit-no-such-binary"); !errors.Is(err, utilexec.ErrExecutableNotFound) {
		t.Errorf("LookPath of a missing binary: %v, want ErrExecutableNotFound", err)
	}
	if err := e.Command(filepath.Join(t.TempDir(), "missing")).Run(); !errors.Is(err, utilexec.ErrExecutableNotFound) {
		t.Errorf("Run of a missing binary: %v, want ErrExecutableNotFound", err)
	}
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("no /bin/sh")
	}
	err := e.Command("/bin/sh", "-c", "exit 3").Run()
	var ee utilexec.ExitError
	if !errors.As(err, &ee) || !ee.Exited() || ee.ExitStatus() != 3 {
		t.Errorf("exit 3: %v, want an ExitError with status 3", err)
	}
	out, err := e.Command("/bin/sh", "-c", "echo hi").Output()
	if err != nil || string(out) != "hi\n" {
		t.Errorf("Output = %q, %v; want \"hi\\n\"", out, err)
	}
}
