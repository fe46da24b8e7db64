package manifests

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"testing"

	v1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/proxykit/proxykit/internal/testkit/clustertest"
)

// clusterFiles writes the Services of clustertest.Cluster(services, 10),
// each with its slice, into files of perFile Services, and the Node into
// a file of its own; edit, when not nil, changes the objects first.
func clusterFiles(b *testing.B, dir string, services, perFile int, edit func(*v1.Service)) {
	b.Helper()
	var buf bytes.Buffer
	file := 0
	flush := func() {
		if buf.Len() == 0 {
			return
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("services-%02d.yaml", file)), buf.Bytes(), 0o644); err != nil {
			b.Fatal(err)
		}
		buf.Reset()
		file++
	}
	n := 0
	for _, o := range clustertest.Cluster(services, 10) {
		if svc, ok := o.(*v1.Service); ok {
			if n > 0 && n%perFile == 0 {
				flush()
			}
			n++
			if edit != nil {
				edit(svc)
			}
		}
		y, err := yaml.Marshal(o)
		if err != nil {
			b.Fatal(err)
		}
		if _, ok := o.(*v1.Node); ok {
			if err := os.WriteFile(filepath.Join(dir, "node.yaml"), y, 0o644); err != nil {
				b.Fatal(err)
			}
			continue
		}
		buf.WriteString("---\n")
		buf.Write(y)
	}
	flush()
}

// BenchmarkReloadEditOne times the reload that follows an edit of one
// Service's port in a file of 1,000 Services and their slices of 10
// endpoints: the file is read again and, in it, the edited document
// decoded and compared. Each iteration edits the port back or forth; the
// file is written with the timer stopped.
//
//	go test -run '^$' -bench '^BenchmarkReloadEditOne$' -benchmem ./examples/proxier/manifests
func BenchmarkReloadEditOne(b *testing.B) {
	dir := b.TempDir()
	clusterFiles(b, dir, 1000, 1000, nil)
	name := filepath.Join(dir, "services-00.yaml")
	var versions [2][]byte
	for i := range versions {
		edited := b.TempDir()
		clusterFiles(b, edited, 1000, 1000, func(svc *v1.Service) {
			if svc.Name == "svc-500" {
				svc.Spec.Ports[0].Port = 81 + int32(i)
			}
		})
		data, err := os.ReadFile(filepath.Join(edited, "services-00.yaml"))
		if err != nil {
			b.Fatal(err)
		}
		versions[i] = data
	}
	ctx := context.Background()
	src, problems, err := New(ctx, dir)
	if err != nil || len(problems) > 0 {
		b.Fatal(err, problems)
	}
	i := 0
	for b.Loop() {
		b.StopTimer()
		if err := os.WriteFile(name, versions[i%2], 0o644); err != nil {
			b.Fatal(err)
		}
		i++
		b.StartTimer()
		if _, err := src.Reload(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSourceHeap reports the live heap a Source holds (MB-heap) once
// it has loaded 10,000 Services with slices of 10 endpoints, in files of
// 1,000, and the heap after reloads that each edit one Service
// (MB-heap-edited): objects, caches and the fake clientset's store, with no
// informer. The body runs once, whatever b.N.
//
//	go test -run '^$' -bench '^BenchmarkSourceHeap$' -benchtime 1x ./examples/proxier/manifests
func BenchmarkSourceHeap(b *testing.B) {
	dir := b.TempDir()
	clusterFiles(b, dir, 10000, 1000, nil)
	heap := func() float64 {
		var m goruntime.MemStats
		goruntime.GC()
		goruntime.GC()
		goruntime.ReadMemStats(&m)
		return float64(m.HeapAlloc) / (1 << 20)
	}
	before := heap()
	ctx := context.Background()
	src, problems, err := New(ctx, dir)
	if err != nil || len(problems) > 0 {
		b.Fatal(err, problems)
	}
	loaded := heap() - before
	// Edits of the first Service of each file, back and forth.
	for e := range 20 {
		name := filepath.Join(dir, fmt.Sprintf("services-%02d.yaml", e%10))
		data, err := os.ReadFile(name)
		if err != nil {
			b.Fatal(err)
		}
		from, to := []byte("port: 80\n"), []byte("port: 81\n")
		if e >= 10 {
			from, to = to, from
		}
		if err := os.WriteFile(name, bytes.Replace(data, from, to, 1), 0o644); err != nil {
			b.Fatal(err)
		}
		if _, err := src.Reload(ctx); err != nil {
			b.Fatal(err)
		}
	}
	edited := heap() - before
	goruntime.KeepAlive(src)
	b.ReportMetric(loaded, "MB-heap")
	b.ReportMetric(edited, "MB-heap-edited")
	for range b.N {
	}
}
