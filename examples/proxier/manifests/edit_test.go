package manifests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// decodeRecorder records the documents a Source decodes.
type decodeRecorder struct {
	mu   sync.Mutex
	docs []string
}

func (r *decodeRecorder) record(file string, document int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.docs = append(r.docs, fmt.Sprintf("%s:%d", filepath.Base(file), document))
}

// take returns the documents recorded since the last call.
func (r *decodeRecorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.docs
	r.docs = nil
	return out
}

// TestReloadDecodesOnlyChangedDocuments edits documents of a 100-document
// file and checks that a reload decodes only the documents whose bytes
// changed, and sends one event per changed object, while the problems of
// the documents taken from the cache keep their positions as the file now
// has them.
func TestReloadDecodesOnlyChangedDocuments(t *testing.T) {
	const services = 50 // each a Service and a slice: 100 documents
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	base := servicesYAML("s", "a", services)
	bad := "---\n{\"apiVersion\": \"v1\", \"kind\": \"ConfigMap\", \"metadata\": {\"name\": \"c\"}}\n"
	write(t, path, base+bad)
	ctx := context.Background()
	src, problems, err := New(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) != 1 || problems[0].Document != 2*services+1 {
		t.Fatalf("problems = %v, want the ConfigMap, document %d", problems, 2*services+1)
	}
	var decoded decodeRecorder
	src.decoded = decoded.record
	events := recordEvents(t, src.Client(), 2*services)

	for _, tc := range []struct {
		name        string
		content     string
		wantDecoded []string
		wantEvents  []string
		// wantProblem is the ConfigMap's document.
		wantProblem int
	}{{
		name:        "one Service's port",
		content:     strings.Replace(base, `"name": "s-7", "namespace": "a"},`+"\n"+` "spec": {"clusterIP": "10.96.0.7", "ports": [{"name": "p", "port": 80,`, `"name": "s-7", "namespace": "a"},`+"\n"+` "spec": {"clusterIP": "10.96.0.7", "ports": [{"name": "p", "port": 81,`, 1) + bad,
		wantDecoded: []string{"cluster.yaml:15"},
		wantEvents:  []string{"MODIFIED a/s-7"},
		wantProblem: 2*services + 1,
	}, {
		name:        "back, and a document in front that moves the others",
		content:     "---\n# a comment\n" + base + bad,
		wantDecoded: []string{"cluster.yaml:1", "cluster.yaml:16"},
		wantEvents:  []string{"MODIFIED a/s-7"},
		wantProblem: 2*services + 2,
	}, {
		name:        "no change",
		content:     "---\n# a comment\n" + base + bad,
		wantProblem: 2*services + 2,
	}, {
		name:        "one slice removed",
		content:     "---\n# a comment\n" + strings.Replace(base, `"name": "s-3-x"`, `"name": "s-3-y"`, 1) + bad,
		wantDecoded: []string{"cluster.yaml:9"},
		wantEvents:  []string{"ADDED a/s-3-y", "DELETED a/s-3-x"},
		wantProblem: 2*services + 2,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			write(t, path, tc.content)
			problems, err := src.Reload(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantDecoded, decoded.take()); diff != "" {
				t.Errorf("documents decoded (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantEvents, sorted(events())); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			if len(problems) != 1 || problems[0].Document != tc.wantProblem || !strings.Contains(problems[0].Error(), "ConfigMap") {
				t.Errorf("problems = %v, want the ConfigMap, document %d", problems, tc.wantProblem)
			}
		})
	}
	svc, err := src.Client().CoreV1().Services("a").Get(ctx, "s-7", metav1.GetOptions{})
	if err != nil || svc.Spec.Ports[0].Port != 80 {
		t.Errorf("s-7 = %v (%v), want port 80 again", svc, err)
	}
}

// TestReloadFilesReadsOnlyDirtyFiles checks that a reload told which files
// changed reads only those (and new ones): a change to another file is
// not seen until a reload names it or reads everything.
func TestReloadFilesReadsOnlyDirtyFiles(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	write(t, a, servicesYAML("a", "x", 2))
	write(t, b, servicesYAML("b", "x", 2))
	ctx := context.Background()
	src, _, err := New(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	var decoded decodeRecorder
	src.decoded = decoded.record
	events := recordEvents(t, src.Client(), 8)

	write(t, a, strings.Replace(servicesYAML("a", "x", 2), `"port": 80,`, `"port": 81,`, 1))
	write(t, b, strings.Replace(servicesYAML("b", "x", 2), `"port": 80,`, `"port": 81,`, 1))
	c := filepath.Join(dir, "c.yaml")
	write(t, c, servicesYAML("c", "x", 1))
	if _, err := src.reloadFiles(ctx, map[string]bool{b: true}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"b.yaml:1", "c.yaml:1", "c.yaml:2"}, decoded.take()); diff != "" {
		t.Errorf("documents decoded (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"ADDED x/c-0", "ADDED x/c-0-x", "MODIFIED x/b-0"}, sorted(events())); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if _, err := src.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a.yaml:1"}, decoded.take()); diff != "" {
		t.Errorf("documents decoded by the full reload (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"MODIFIED x/a-0"}, events()); diff != "" {
		t.Errorf("events of the full reload (-want +got):\n%s", diff)
	}
}

// TestWatchRelativePathEditOneDocument follows a directory named by a
// relative path, as the flag is often given, and checks that an edit of
// one document in one of its files is decoded alone and arrives as one
// event: the watch names the files it saw change as the reload does.
func TestWatchRelativePathEditOneDocument(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	if err := os.Mkdir("m", 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join("m", "a.yaml"), servicesYAML("a", "x", 20))
	write(t, filepath.Join("m", "b.yaml"), servicesYAML("b", "x", 20))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src, _, err := New(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	events := recordEvents(t, src.Client(), 80)
	if err := src.Watch(ctx, 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// The watch's first reload reads every file, and decodes nothing
	// that did not change; the hook is set after it.
	time.Sleep(200 * time.Millisecond)
	var decoded decodeRecorder
	src.mu.Lock()
	src.decoded = decoded.record
	src.mu.Unlock()
	tmp := filepath.Join("m", ".b.yaml.swp")
	write(t, tmp, strings.Replace(servicesYAML("b", "x", 20), `"name": "b-4-x"`, `"name": "b-4-y"`, 1))
	if err := os.Rename(tmp, filepath.Join("m", "b.yaml")); err != nil {
		t.Fatal(err)
	}
	var got []string
	for len(got) < 2 {
		got = append(got, waitEvents(t, events)...)
	}
	if diff := cmp.Diff([]string{"ADDED x/b-4-y", "DELETED x/b-4-x"}, sorted(got)); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"b.yaml:10"}, decoded.take()); diff != "" {
		t.Errorf("documents decoded (-want +got):\n%s", diff)
	}
}
