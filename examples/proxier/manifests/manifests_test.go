package manifests

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

const clusterYAML = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abc
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
endpoints:
- addresses: [10.0.1.5]
ports: [{name: http, port: 8080, protocol: TCP}]
---
# a comment-only document is skipped silently
---
apiVersion: v1
kind: ConfigMap
metadata: {name: not-ours}
---
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: z1}}
`

const listYAML = `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: dns}
  spec:
    clusterIP: 10.96.0.53
    ports: [{name: dns, port: 53, protocol: UDP}]
`

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// names lists "Kind ns/name" for everything in the clientset.
func names(t *testing.T, c kubernetes.Interface) []string {
	t.Helper()
	ctx := context.Background()
	var out []string
	svcs, err := c.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs.Items {
		out = append(out, "Service "+s.Namespace+"/"+s.Name)
	}
	slices, err := c.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slices.Items {
		out = append(out, "EndpointSlice "+s.Namespace+"/"+s.Name)
	}
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		out = append(out, "Node "+n.Name)
	}
	return out
}

func TestNewLoadsDirectoryAndReportsProblems(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a-cluster.yaml"), clusterYAML)
	write(t, filepath.Join(dir, "b-list.yml"), listYAML)
	write(t, filepath.Join(dir, "c-bad.yaml"), "apiVersion: v1\nkind: Service\nmetadata: {name: ok, namespace: x}\nspec: {ports: [{port: 80}]}\n---\nkind: [unclosed\n")
	write(t, filepath.Join(dir, "notes.txt"), "not a manifest")

	src, problems, err := New(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"EndpointSlice shop/web-abc",
		"Node node-a",
		"Service default/dns",
		"Service shop/web",
		"Service x/ok",
	}
	got := names(t, src.Client())
	if diff := cmp.Diff(want, sorted(got)); diff != "" {
		t.Errorf("objects (-want +got):\n%s", diff)
	}
	var where []string
	for _, p := range problems {
		where = append(where, filepath.Base(p.File)+"#"+string(rune('0'+p.Document)))
	}
	if diff := cmp.Diff([]string{"a-cluster.yaml#4", "c-bad.yaml#2"}, where); diff != "" {
		t.Errorf("problems (-want +got):\n%s\n%v", diff, problems)
	}
	if !strings.Contains(problems[0].Error(), "unsupported kind ConfigMap") {
		t.Errorf("problem message %q does not name the kind", problems[0].Error())
	}
}

func TestNewMissingPath(t *testing.T) {
	if _, _, err := New(context.Background(), filepath.Join(t.TempDir(), "nope.yaml")); err == nil {
		t.Fatal("New on a missing path returned no error")
	}
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// recordEvents collects watch events on services and endpoint slices, after
// the initial ADDED event the fake sends for each of the existing objects.
// Watches deliver asynchronously, so each call of the returned function
// writes and deletes a sentinel Service and EndpointSlice and reads up to
// the sentinels' deletion: it returns every event of the writes made before
// it, and only those.
func recordEvents(t *testing.T, c kubernetes.Interface, existing int) func() []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	sw, err := c.CoreV1().Services("").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ew, err := c.DiscoveryV1().EndpointSlices("").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sw.Stop)
	t.Cleanup(ew.Stop)
	for range existing {
		select {
		case <-sw.ResultChan():
		case <-ew.ResultChan():
		case <-time.After(10 * time.Second):
			t.Fatal("initial watch events did not arrive")
		}
	}
	const sentinelNS = "sentinel"
	return func() []string {
		meta := metav1.ObjectMeta{Namespace: sentinelNS, Name: "sentinel"}
		if _, err := c.CoreV1().Services(sentinelNS).Create(ctx, &v1.Service{ObjectMeta: meta}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := c.CoreV1().Services(sentinelNS).Delete(ctx, meta.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.DiscoveryV1().EndpointSlices(sentinelNS).Create(ctx, &discoveryv1.EndpointSlice{ObjectMeta: meta}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := c.DiscoveryV1().EndpointSlices(sentinelNS).Delete(ctx, meta.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, w := range []watch.Interface{sw, ew} {
			for {
				var ev watch.Event
				select {
				case ev = <-w.ResultChan():
				case <-time.After(10 * time.Second):
					t.Fatalf("the sentinel's events did not arrive; got %v", out)
				}
				m := ev.Object.(metav1.Object)
				if m.GetNamespace() == sentinelNS {
					if ev.Type == watch.Deleted {
						break
					}
					continue
				}
				out = append(out, string(ev.Type)+" "+m.GetNamespace()+"/"+m.GetName())
			}
		}
		return out
	}
}

func TestReloadSendsOnlyChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	write(t, path, clusterYAML)
	ctx := context.Background()
	src, _, err := New(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	events := recordEvents(t, src.Client(), 2)

	// Nothing changed: no events.
	if _, err := src.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if got := events(); len(got) != 0 {
		t.Errorf("reload without changes sent events: %v", got)
	}

	// Change the service's port, drop the slice, add a service.
	edited := strings.Replace(clusterYAML, "port: 80,", "port: 8080,", 1)
	edited = strings.Replace(edited, "kind: EndpointSlice", "kind: EndpointSliceGone", 1)
	edited += "---\napiVersion: v1\nkind: Service\nmetadata: {name: api, namespace: shop}\nspec: {clusterIP: 10.96.0.11, ports: [{port: 443}]}\n"
	write(t, path, edited)
	problems, err := src.Reload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) != 2 { // the renamed kind and the ConfigMap
		t.Errorf("problems = %v, want 2", problems)
	}
	want := []string{"ADDED shop/api", "DELETED shop/web-abc", "MODIFIED shop/web"}
	if diff := cmp.Diff(want, sorted(events())); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	svc, err := src.Client().CoreV1().Services("shop").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Spec.Ports[0].Port != 8080 {
		t.Errorf("service port = %d, want 8080", svc.Spec.Ports[0].Port)
	}
}

// TestReloadParsesOnlyChangedFiles checks that a reload of a directory
// parses again only the files whose bytes changed, keeps the objects of the
// others as they were, and still finds duplicates across files.
func TestReloadParsesOnlyChangedFiles(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	write(t, a, clusterYAML)
	write(t, b, listYAML)
	ctx := context.Background()
	src, _, err := New(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	parsedA, parsedB := src.files[a], src.files[b]
	events := recordEvents(t, src.Client(), 3)

	write(t, b, strings.Replace(listYAML, "port: 53", "port: 5353", 1))
	problems, err := src.Reload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if src.files[a] != parsedA {
		t.Error("the unchanged file was parsed again")
	}
	if src.files[b] == parsedB {
		t.Error("the changed file was not parsed again")
	}
	if diff := cmp.Diff([]string{"MODIFIED default/dns"}, events()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if len(problems) != 1 || problems[0].File != a || problems[0].Document != 4 {
		t.Errorf("problems = %v, want the ConfigMap of a.yaml, document 4, from the cached parse", problems)
	}

	// A duplicate in a new file is reported against it, and wins.
	c := filepath.Join(dir, "c.yaml")
	write(t, c, strings.Replace(listYAML, "port: 53", "port: 5454", 1))
	problems, err = src.Reload(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) != 2 || problems[1].File != c || !strings.Contains(problems[1].Error(), "also defined at "+b+" document 1") {
		t.Errorf("problems = %v, want the ConfigMap and the duplicate in c.yaml", problems)
	}
	svc, err := src.Client().CoreV1().Services("default").Get(ctx, "dns", metav1.GetOptions{})
	if err != nil || svc.Spec.Ports[0].Port != 5454 {
		t.Errorf("dns = %v (%v), want the later file's port", svc, err)
	}

	// A removed file takes its objects and its cache entry with it.
	if err := os.Remove(c); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := src.files[c]; ok {
		t.Error("the removed file is still cached")
	}
}

func TestWatchFollowsFileEdits(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cluster.yaml")
	write(t, path, clusterYAML)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src, _, err := New(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	events := recordEvents(t, src.Client(), 2)
	if err := src.Watch(ctx, 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// Replace the file the way editors do: write a temporary file, rename.
	tmp := filepath.Join(dir, ".cluster.yaml.swp")
	write(t, tmp, strings.Replace(clusterYAML, "10.0.1.5", "10.0.1.6", 1))
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	var got []string
	deadline := time.After(10 * time.Second)
	for len(got) == 0 {
		select {
		case <-deadline:
			t.Fatal("no event 10 s after the manifest changed")
		case <-time.After(10 * time.Millisecond):
			got = events()
		}
	}
	if diff := cmp.Diff([]string{"MODIFIED shop/web-abc"}, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

// TestReloadStopsWithContext checks that a reload cut short by its context
// (the proxier shutting down) says so and leaves the rest to the next one.
func TestReloadStopsWithContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	write(t, path, listYAML)
	src, _, err := New(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	write(t, path, clusterYAML)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := src.Reload(cancelled); !errors.Is(err, context.Canceled) {
		t.Errorf("reload with a cancelled context: error %v, want context.Canceled", err)
	}
	if diff := cmp.Diff([]string{"Service default/dns"}, names(t, src.Client())); diff != "" {
		t.Errorf("objects after the cancelled reload (-want +got):\n%s", diff)
	}
	if _, err := src.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []string{"EndpointSlice shop/web-abc", "Node node-a", "Service shop/web"}
	if diff := cmp.Diff(want, sorted(names(t, src.Client()))); diff != "" {
		t.Errorf("objects after the next reload (-want +got):\n%s", diff)
	}
}

// TestWatchFollowsDirectoryReplacement checks that the watch follows the
// manifests directory by name: after the directory is removed and made
// again, or another one is renamed to its name, the files of the new one
// are read, and a later edit in it flows through as events.
func TestWatchFollowsDirectoryReplacement(t *testing.T) {
	for _, tc := range []struct {
		name    string
		replace func(t *testing.T, dir, content string)
	}{{
		name: "rm -rf, mkdir, write",
		replace: func(t *testing.T, dir, content string) {
			if err := os.RemoveAll(dir); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(dir, "cluster.yaml"), content)
		},
	}, {
		name: "renamed over",
		replace: func(t *testing.T, dir, content string) {
			// The atomic replace of configuration tools: build the new
			// directory aside, move the old one away, move the new one in.
			next, old := dir+".new", dir+".old"
			if err := os.Mkdir(next, 0o755); err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(next, "cluster.yaml"), content)
			if err := os.Rename(dir, old); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(next, dir); err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(old); err != nil {
				t.Fatal(err)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "manifests")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(dir, "cluster.yaml"), clusterYAML)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			src, _, err := New(ctx, dir)
			if err != nil {
				t.Fatal(err)
			}
			events := recordEvents(t, src.Client(), 2)
			// A settle long enough that the steps of a replace fold into
			// one reload: a reload of the new directory before its file is
			// written would delete the objects and add them again.
			if err := src.Watch(ctx, 200*time.Millisecond); err != nil {
				t.Fatal(err)
			}

			tc.replace(t, dir, strings.Replace(clusterYAML, "10.0.1.5", "10.0.1.6", 1))
			if diff := cmp.Diff([]string{"MODIFIED shop/web-abc"}, waitEvents(t, events)); diff != "" {
				t.Errorf("events after the replace (-want +got):\n%s", diff)
			}
			// The new directory is watched: an edit in it flows through.
			write(t, filepath.Join(dir, "cluster.yaml"), strings.Replace(clusterYAML, "10.0.1.5", "10.0.1.7", 1))
			if diff := cmp.Diff([]string{"MODIFIED shop/web-abc"}, waitEvents(t, events)); diff != "" {
				t.Errorf("events after an edit in the new directory (-want +got):\n%s", diff)
			}
			slice, err := src.Client().DiscoveryV1().EndpointSlices("shop").Get(ctx, "web-abc", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := slice.Endpoints[0].Addresses[0]; got != "10.0.1.7" {
				t.Errorf("endpoint address = %s, want the edit's 10.0.1.7", got)
			}
		})
	}
}

// waitEvents polls events until it returns some, for at most 10 seconds.
func waitEvents(t *testing.T, events func() []string) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got := events(); len(got) > 0 {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatal("no event 10 s after the manifests changed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
