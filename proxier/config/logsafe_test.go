package config

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// TestWatchErrorLogIsOneLine checks that a list error whose text (which
// can come from the API server) holds line breaks and carriage returns is
// logged escaped, one line per failure, so that it cannot forge log lines.
func TestWatchErrorLogIsOneLine(t *testing.T) {
	var buf bytes.Buffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&buf), textlogger.Verbosity(4)))
	ctx := klog.NewContext(context.Background(), logger)
	c := &ServiceCIDRConfig{failed: make(chan struct{})}
	err := errors.New("forbidden\nE1127 00:00:00.000000       1 forged.go:1] \"forged\"\r")
	c.watchError(ctx, nil, err) // the first failure, at the default verbosity
	c.watchError(ctx, nil, err) // a later one, at V(4)
	out := buf.String()
	if n := strings.Count(out, "\n"); n != 2 {
		t.Errorf("%d lines, want 2 (one per failure):\n%s", n, out)
	}
	if strings.Contains(out, "\r") || strings.Contains(out, "\nE1127 00:00:00") {
		t.Errorf("the log holds a forged line or a carriage return:\n%q", out)
	}
}
