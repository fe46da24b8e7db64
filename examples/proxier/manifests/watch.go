package manifests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"
)

// Watch reloads the manifests whenever a file under the source's path is
// written, created, renamed or removed, until ctx is done. Bursts of file
// events (an editor writing a file in several steps) are folded into one
// reload that happens settle after the last event. Problems and errors of a
// reload are logged; the previous state stays in place for objects that
// could not be read. It returns an error only if the watch cannot start.
func (s *Source) Watch(ctx context.Context, settle time.Duration) error {
	logger := klog.FromContext(ctx)
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching manifests %s: %w", s.path, err)
	}
	dir, onlyFile, err := watchTarget(s.path)
	if err != nil {
		w.Close()
		return err
	}
	// A single file is watched through its directory: editors and
	// `kubectl`-style tools often replace a file rather than write it, and a
	// watch on the file itself would end with the old inode.
	if err := w.Add(dir); err != nil {
		w.Close()
		return fmt.Errorf("watching manifests %s: %w", dir, err)
	}
	go func() {
		defer w.Close()
		var timer *time.Timer
		var fire <-chan time.Time
		for {
			select {
			case <-ctx.Done():
				if timer != nil {
					timer.Stop()
				}
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if onlyFile != "" && filepath.Clean(ev.Name) != onlyFile {
					continue
				}
				if onlyFile == "" && !isManifestName(filepath.Base(ev.Name)) {
					continue
				}
				if timer == nil {
					timer = time.NewTimer(settle)
				} else {
					timer.Reset(settle)
				}
				fire = timer.C
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				logger.Error(err, "Manifest watch error", "path", s.path)
			case <-fire:
				fire = nil
				problems, err := s.Reload(ctx)
				for _, p := range problems {
					logger.Error(p.Err, "Skipping manifest document", "file", p.File, "document", p.Document)
				}
				if err != nil && ctx.Err() != nil {
					return // shutting down: the rest applies at the next start
				}
				if err != nil {
					logger.Error(err, "Reloading manifests", "path", s.path)
					continue
				}
				logger.V(2).Info("Manifests reloaded", "path", s.path)
			}
		}
	}()
	return nil
}

// watchTarget returns the directory to watch and, when path is a file, the
// cleaned file name to filter events by.
func watchTarget(path string) (dir, file string, err error) {
	info, err := os.Stat(path)
	if err != nil {
		return "", "", fmt.Errorf("watching manifests %s: %w", path, err)
	}
	if info.IsDir() {
		return path, "", nil
	}
	return filepath.Dir(path), filepath.Clean(path), nil
}
