package manifests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/internal/logsafe"
)

// Watch reloads the manifests whenever a file under the source's path is
// written, created, renamed or removed, until ctx is done. Bursts of file
// events (an editor writing a file in several steps) are folded into one
// reload that happens settle after the last event. A reload reads only the
// files the watch saw change, and decodes in them only the documents whose
// bytes changed; everything is read again when the directory itself
// changed or the kernel dropped events. Problems and errors of a reload
// are logged; the previous state stays in place for objects that could not
// be read.
//
// The directory is followed by name, as files are: when it is removed and
// created again, or another directory is renamed to its name (the atomic
// replace of editors and configuration tools), the new one is watched and
// read. While the directory is missing, reloads fail and the objects stay
// as they were. It returns an error only if the watch cannot start.
func (s *Source) Watch(ctx context.Context, settle time.Duration) error {
	logger := klog.FromContext(ctx)
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching manifests %q: %w", s.path, err)
	}
	dir, onlyFile, err := watchTarget(s.path)
	if err != nil {
		w.Close()
		return err
	}
	// A single file is watched through its directory: editors and
	// `kubectl`-style tools often replace a file rather than write it, and a
	// watch on the file itself would end with the old inode. For the same
	// reason the directory is watched through its parent too: a watch on
	// the directory ends with the directory's inode.
	if err := w.Add(dir); err != nil {
		w.Close()
		return fmt.Errorf("watching manifests %q: %w", dir, err)
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := w.Add(parent); err != nil {
			w.Close()
			return fmt.Errorf("watching manifests %q: %w", parent, err)
		}
	}
	go func() {
		defer w.Close()
		var timer *time.Timer
		var fire <-chan time.Time
		arm := func() {
			if timer == nil {
				timer = time.NewTimer(settle)
			} else {
				timer.Reset(settle)
			}
			fire = timer.C
		}
		// dirty names, as readPath names them, the files changed since the
		// last reload; all is set when every file is to be read again. The
		// first reload reads them all, for what changed between New and
		// the start of the watch.
		dirty, all := map[string]bool{}, true
		arm()
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
				name := filepath.Clean(ev.Name)
				switch {
				case name == dir:
					// The directory itself was removed, renamed or
					// (again) created. Watching the new one before the
					// reload below reads it means that a file written in it
					// after this is either read by that reload or seen by
					// the new watch.
					if ev.Has(fsnotify.Create) {
						if err := w.Add(dir); err != nil {
							logger.Error(err, "Watching the manifests directory again", "path", logsafe.Quote(dir))
						}
					}
				case filepath.Dir(name) != dir:
					continue // another entry of the parent directory
				case onlyFile != "" && name != onlyFile:
					continue
				case onlyFile == "" && !isManifestName(filepath.Base(name)):
					continue
				}
				switch {
				case name == dir:
					all = true
				case onlyFile != "":
					dirty[s.path] = true
				default:
					dirty[filepath.Join(s.path, filepath.Base(name))] = true
				}
				arm()
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				logger.Error(err, "Manifest watch error", "path", logsafe.Quote(s.path))
				// Events may have been lost (the kernel's queue overflowed):
				// read everything at the next reload, which this one asks for.
				all = true
				arm()
			case <-fire:
				fire = nil
				var only map[string]bool
				if !all {
					only = dirty
				}
				problems, err := s.reloadFiles(ctx, only)
				LogProblems(logger, problems)
				if err != nil && ctx.Err() != nil {
					return // shutting down: the rest applies at the next start
				}
				if err != nil {
					// What this reload did not apply is applied by the
					// next, which reads every file again.
					all = true
					logger.Error(err, "Reloading manifests", "path", logsafe.Quote(s.path))
					continue
				}
				dirty, all = map[string]bool{}, false
				logger.V(2).Info("Manifests reloaded", "path", logsafe.Quote(s.path))
			}
		}
	}()
	return nil
}

// watchTarget returns the directory to watch, cleaned and absolute, and,
// when path is a file, the cleaned file name to filter events by.
func watchTarget(path string) (dir, file string, err error) {
	info, err := os.Stat(path)
	if err != nil {
		return "", "", fmt.Errorf("watching manifests %q: %w", path, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", "", fmt.Errorf("watching manifests %q: %w", path, err)
	}
	if info.IsDir() {
		return abs, "", nil
	}
	return filepath.Dir(abs), abs, nil
}
