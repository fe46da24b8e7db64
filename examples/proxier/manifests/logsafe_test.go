package manifests

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"k8s.io/klog/v2/textlogger"
)

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestLogProblemsCannotForgeLines checks that names and file content with
// line breaks and escapes are logged escaped: every problem is one line,
// and the forged header never starts a line.
func TestLogProblemsCannotForgeLines(t *testing.T) {
	// A header of a date no test runs on, so that no real line starts so.
	const forged = `E0229 00:00:00.000000       1 forged.go:1] owned`
	dir := t.TempDir()
	// The file's name, the object's name and namespace, and bad YAML all
	// carry a line break followed by a forged log header.
	path := filepath.Join(dir, "a\n"+forged+".yaml")
	write(t, path, `apiVersion: v1
kind: Service
metadata: {name: "web\n`+forged+`", namespace: "ns\r"}
spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}
---
apiVersion: v1
kind: Node
metadata: {name: "node\u001b[31m"}
---
apiVersion: v1
kind: Service
metadata: {name: web2, namespace: ns}
spec: {clusterIP: 10.96.0.1, clusterIPs: ["10.96.0.2\n`+forged+`"], ports: [{port: 80}]}
---
kind: "x\n`+forged+`"
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: ns}
spec: {clusterIP: 10.96.0.3, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: "web\n`+forged+`", namespace: "ns\r"}
spec: {clusterIP: 10.96.0.4, ports: [{port: 80}]}
`)
	src, problems, err := New(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	LogProblems(textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&out))), problems)
	// The refused Node and web2, the document without apiVersion, and the
	// forged Service's duplicate and refusal.
	if len(problems) != 5 {
		t.Errorf("problems = %v, want 5", problems)
	}
	log := out.String()
	if n := strings.Count(log, "\n"); n != len(problems) {
		t.Errorf("%d problems logged as %d lines:\n%s", len(problems), n, log)
	}
	for _, line := range strings.Split(log, "\n") {
		if strings.HasPrefix(strings.TrimLeft(line, " \t"), forged[:5]) {
			t.Errorf("forged line in the log:\n%s", log)
		}
	}
	if strings.ContainsAny(log, "\r\x1b") {
		t.Errorf("raw carriage return or escape in the log: %q", log)
	}
	if !strings.Contains(log, `"Refusing an invalid manifest object"`) || !strings.Contains(log, `kind="Service"`) {
		t.Errorf("the refusal is not logged with its kind:\n%s", log)
	}
	if names := names(t, src.Client()); len(names) != 1 || names[0] != "Service ns/web" {
		t.Errorf("objects = %v, want the valid Service alone", names)
	}
}
