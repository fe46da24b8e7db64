package manifests

import (
	"fmt"
	"strconv"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	clienttesting "k8s.io/client-go/testing"
)

// Limits of the store's watches; a store copies them, so that a test can
// make its own small.
const (
	// historySize is how many recent events of each resource the store
	// keeps, so that a watch resumed from a resource version (after a List,
	// or after its previous watch ended) gets what it missed. Older resource
	// versions are refused with 410 Gone and the reflector lists again, as
	// with an API server's watch cache.
	historySize = 1024
	// watchQueueLimit is how many events a watch may hold that its reader
	// has not taken. Beyond it the watch is ended, as an API server ends the
	// watch of a client that does not keep up; the reflector then resumes
	// from the last resource version it saw. It bounds the memory a reader
	// that stopped reading without calling Stop can hold.
	watchQueueLimit = 1 << 16
)

// clientset is client-go's fake clientset over a [store]. The embedded
// fake's own object tracker is left unused.
type clientset struct {
	*fake.Clientset
	store *store
}

// newClientset returns an empty clientset whose reads, writes and watches
// all go to one store.
func newClientset() *clientset {
	// The simple clientset, not NewClientset: field management builds a
	// REST mapper at every write, which dominates loading a large
	// cluster, and a proxier has no use for it.
	cs := &clientset{Clientset: fake.NewSimpleClientset(), store: newStore()}
	cs.ReactionChain = nil
	cs.WatchReactionChain = nil
	cs.AddReactor("*", "*", clienttesting.ObjectReaction(cs.store))
	cs.AddWatchReactor("*", func(action clienttesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := action.(clienttesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := cs.store.Watch(action.GetResource(), action.GetNamespace(), opts)
		return true, w, err
	})
	return cs
}

// Tracker returns the store, for tests that write to it directly; the
// embedded fake's would return its own tracker, which holds nothing.
func (c *clientset) Tracker() clienttesting.ObjectTracker { return c.store }

// IsWatchListSemanticsUnSupported tells client-go's reflector that this
// clientset's watches can stream a list (sendInitialEvents, ended by a
// bookmark), as an API server's do. The embedded fake says it cannot, which
// makes every informer log, at -v=2, that this "is expected in unit tests
// but not in production".
func (*clientset) IsWatchListSemanticsUnSupported() bool { return false }

// store is the object store behind the fake clientset: a
// [clienttesting.ObjectTracker] that keeps the objects in client-go's
// simple tracker and serves watches itself, the way an API server does,
// where the simple tracker's cannot:
//
//   - a write never blocks or panics however slowly the watches are read
//     (the simple tracker's watches panic with "channel full" after 100
//     unread events);
//   - every write, deletions included, has its own resource version, set in
//     the object, so a watch resumed from a List's resource version gets
//     exactly what the List did not have;
//   - watches stream the initial list when asked (sendInitialEvents).
//
// Watches filter by label and field selector, as an API server's do, and do
// not time out.
type store struct {
	objects clienttesting.ObjectTracker

	mu       sync.Mutex
	rv       int64 // the resource version of the last write, of any resource
	history  map[schema.GroupVersionResource]*history
	watchers map[schema.GroupVersionResource]map[*watcher]struct{}
	kinds    map[schema.GroupVersionResource]schema.GroupVersionKind

	// historySize and queueLimit are historySize and watchQueueLimit,
	// fixed before the first write.
	historySize, queueLimit int
}

var _ clienttesting.ObjectTracker = (*store)(nil)

func newStore() *store {
	return &store{
		objects:  clienttesting.NewObjectTracker(scheme.Scheme, scheme.Codecs.UniversalDecoder()),
		history:  map[schema.GroupVersionResource]*history{},
		watchers: map[schema.GroupVersionResource]map[*watcher]struct{}{},
		kinds:    map[schema.GroupVersionResource]schema.GroupVersionKind{},

		historySize: historySize,
		queueLimit:  watchQueueLimit,
	}
}

// storedEvent is one write, kept for watches that resume from an older
// resource version. Its objects are never changed after it is recorded.
type storedEvent struct {
	rv        int64
	namespace string
	event     watch.Event
	// prev is the object's state before a MODIFIED event, so that a watch
	// whose selector the change makes the object enter or leave sees it
	// ADDED or DELETED instead.
	prev runtime.Object
}

// history is a ring of the most recent events of one resource.
type history struct {
	events []storedEvent
	start  int // index of the oldest event in events
	// since is the resource version from which the history is complete: it
	// has every event with a newer resource version.
	since int64
}

// add keeps e, forgetting the oldest event when the history already has
// size events.
func (h *history) add(e storedEvent, size int) {
	if len(h.events) < size {
		h.events = append(h.events, e)
		return
	}
	h.since = h.events[h.start].rv
	h.events[h.start] = e
	h.start = (h.start + 1) % len(h.events)
}

// after calls f with the events newer than rv, oldest first.
func (h *history) after(rv int64, f func(storedEvent)) {
	for i := range h.events {
		if e := h.events[(h.start+i)%len(h.events)]; e.rv > rv {
			f(e)
		}
	}
}

// Add is part of ObjectTracker: it creates obj (each item of a list) under
// the resource its kind is conventionally served as.
func (s *store) Add(obj runtime.Object) error {
	if meta.IsListType(obj) {
		items, err := meta.ExtractList(obj)
		if err != nil {
			return err
		}
		for _, item := range items {
			if err := s.Add(item); err != nil {
				return err
			}
		}
		return nil
	}
	gvks, _, err := scheme.Scheme.ObjectKinds(obj)
	if err != nil {
		return err
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	gvr, _ := meta.UnsafeGuessKindToResource(gvks[0])
	return s.Create(gvr, obj, m.GetNamespace())
}

// Get is part of ObjectTracker; it returns a copy the caller may change.
func (s *store) Get(gvr schema.GroupVersionResource, ns, name string, opts ...metav1.GetOptions) (runtime.Object, error) {
	return s.objects.Get(gvr, ns, name, opts...)
}

// List is part of ObjectTracker. It holds the objects that opts' label
// and field selectors select, as an API server's list does, and its
// resource version is that of the last write, so a watch from it misses
// nothing. A selector the API server would refuse is a 400 Bad Request.
func (s *store) List(gvr schema.GroupVersionResource, gvk schema.GroupVersionKind, ns string, opts ...metav1.ListOptions) (runtime.Object, error) {
	var o metav1.ListOptions
	if len(opts) > 1 {
		return nil, fmt.Errorf("list %s: expected at most one ListOptions, got %d", gvr.Resource, len(opts))
	}
	if len(opts) == 1 {
		o = opts[0]
	}
	sel, err := newSelection(gvr, o)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	list, err := s.objects.List(gvr, gvk, ns)
	if err != nil {
		return nil, err
	}
	if !sel.all() {
		items, err := meta.ExtractList(list)
		if err != nil {
			return nil, err
		}
		kept := items[:0]
		for _, item := range items {
			if sel.matches(item) {
				kept = append(kept, item)
			}
		}
		if err := meta.SetList(list, kept); err != nil {
			return nil, err
		}
	}
	if lm, err := meta.ListAccessor(list); err == nil {
		lm.SetResourceVersion(strconv.FormatInt(s.rv, 10))
	}
	return list, nil
}

// Create is part of ObjectTracker. As an API server, it refuses an object
// that has a resource version.
func (s *store) Create(gvr schema.GroupVersionResource, obj runtime.Object, ns string, opts ...metav1.CreateOptions) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	obj, m, err := s.prepare(obj, ns)
	if err != nil {
		return err
	}
	if m.GetResourceVersion() != "" {
		return apierrors.NewBadRequest(fmt.Sprintf("%s %s: resourceVersion must not be set on create", gvr.Resource, m.GetName()))
	}
	m.SetResourceVersion(strconv.FormatInt(s.rv+1, 10))
	if err := s.objects.Create(gvr, obj, ns, opts...); err != nil {
		return err
	}
	s.record(gvr, watch.Added, obj, nil)
	return nil
}

// Update is part of ObjectTracker. As an API server, it refuses an object
// whose resource version is set and is not the stored one's (a conflict);
// an empty one updates unconditionally.
func (s *store) Update(gvr schema.GroupVersionResource, obj runtime.Object, ns string, opts ...metav1.UpdateOptions) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.update(gvr, obj, ns, true, func(o runtime.Object) error { return s.objects.Update(gvr, o, ns, opts...) })
}

// Patch is part of ObjectTracker: obj is the stored object with the patch
// applied.
func (s *store) Patch(gvr schema.GroupVersionResource, obj runtime.Object, ns string, opts ...metav1.PatchOptions) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.update(gvr, obj, ns, false, func(o runtime.Object) error { return s.objects.Patch(gvr, o, ns, opts...) })
}

// Apply is part of ObjectTracker; it merges as the simple tracker does,
// without field management.
func (s *store) Apply(gvr schema.GroupVersionResource, applyConfiguration runtime.Object, ns string, opts ...metav1.PatchOptions) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := meta.Accessor(applyConfiguration)
	if err != nil {
		return err
	}
	if err := s.objects.Apply(gvr, applyConfiguration, ns, opts...); err != nil {
		return err
	}
	merged, err := s.objects.Get(gvr, ns, m.GetName())
	if err != nil {
		return err
	}
	return s.update(gvr, merged, ns, false, func(o runtime.Object) error { return s.objects.Update(gvr, o, ns) })
}

// update stores obj as the new version of an existing object through
// write, checking its resource version first when precondition is set.
// The caller holds s.mu.
func (s *store) update(gvr schema.GroupVersionResource, obj runtime.Object, ns string, precondition bool, write func(runtime.Object) error) error {
	obj, m, err := s.prepare(obj, ns)
	if err != nil {
		return err
	}
	old, err := s.objects.Get(gvr, ns, m.GetName())
	if err != nil {
		return err
	}
	oldMeta, err := meta.Accessor(old)
	if err != nil {
		return err
	}
	if rv := m.GetResourceVersion(); precondition && rv != "" && rv != oldMeta.GetResourceVersion() {
		return apierrors.NewConflict(gvr.GroupResource(), m.GetName(),
			fmt.Errorf("resource version %s is not the stored %s", rv, oldMeta.GetResourceVersion()))
	}
	m.SetResourceVersion(strconv.FormatInt(s.rv+1, 10))
	if err := write(obj); err != nil {
		return err
	}
	s.record(gvr, watch.Modified, obj, old)
	return nil
}

// prepare returns a copy of obj that the store owns, in namespace ns when
// it names none.
func (s *store) prepare(obj runtime.Object, ns string) (runtime.Object, metav1.Object, error) {
	obj = obj.DeepCopyObject()
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, nil, err
	}
	if m.GetNamespace() == "" {
		m.SetNamespace(ns)
	}
	return obj, m, nil
}

// Delete is part of ObjectTracker. The DELETED event carries the object's
// last state with the deletion's resource version.
func (s *store) Delete(gvr schema.GroupVersionResource, ns, name string, opts ...metav1.DeleteOptions) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, err := s.objects.Get(gvr, ns, name)
	if err != nil {
		return err
	}
	if err := s.objects.Delete(gvr, ns, name, opts...); err != nil {
		return err
	}
	if m, err := meta.Accessor(old); err == nil {
		m.SetResourceVersion(strconv.FormatInt(s.rv+1, 10))
	}
	s.record(gvr, watch.Deleted, old, nil)
	return nil
}

// record takes the next resource version for a write of obj (whose
// resource version the caller set to it; prev is its state before a
// MODIFIED event), keeps the event and queues it for the resource's
// watches. The caller holds s.mu.
func (s *store) record(gvr schema.GroupVersionResource, typ watch.EventType, obj, prev runtime.Object) {
	s.rv++
	if _, known := s.kinds[gvr]; !known {
		if gvks, _, err := scheme.Scheme.ObjectKinds(obj); err == nil {
			s.kinds[gvr] = gvks[0]
		}
	}
	ns := ""
	if m, err := meta.Accessor(obj); err == nil {
		ns = m.GetNamespace()
	}
	e := storedEvent{rv: s.rv, namespace: ns, event: watch.Event{Type: typ, Object: obj}, prev: prev}
	h := s.history[gvr]
	if h == nil {
		h = &history{}
		s.history[gvr] = h
	}
	h.add(e, s.historySize)
	for w := range s.watchers[gvr] {
		ev, ok := w.event(e)
		if !ok {
			continue
		}
		if !w.send(ev, true) {
			delete(s.watchers[gvr], w)
		}
	}
}

// Watch is part of ObjectTracker. Its events follow an API server's rules
// for opts:
//
//   - sendInitialEvents=true (with resourceVersionMatch=NotOlderThan and
//     allowWatchBookmarks, as the server requires): an ADDED event for each
//     object, then a BOOKMARK annotated k8s.io/initial-events-end carrying
//     the current resource version, then the changes;
//   - resourceVersion "" or "0": an ADDED event for each object, then the
//     changes;
//   - another resourceVersion: the changes made after it; 410 Gone when it
//     is older than the store's history, and a "too large resource version"
//     timeout when it is newer than the last write.
//
// ns "" watches every namespace. Only the objects opts' label and field
// selectors select are sent, as by an API server's watch cache: a change
// that makes an object enter the selection is sent as ADDED, one that
// makes it leave as DELETED (with the object's state before the change
// and the change's resource version). A selector the API server would
// refuse is a 400 Bad Request. The returned watch never blocks a write; it
// ends (its channel closes) on Stop or when its reader falls
// watchQueueLimit events behind.
func (s *store) Watch(gvr schema.GroupVersionResource, ns string, opts ...metav1.ListOptions) (watch.Interface, error) {
	var o metav1.ListOptions
	if len(opts) > 1 {
		return nil, fmt.Errorf("watch %s: expected at most one ListOptions, got %d", gvr.Resource, len(opts))
	}
	if len(opts) == 1 {
		o = opts[0]
	}
	var from int64
	if o.ResourceVersion != "" {
		rv, err := strconv.ParseInt(o.ResourceVersion, 10, 64)
		if err != nil || rv < 0 {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("watch %s: invalid resourceVersion %q", gvr.Resource, o.ResourceVersion))
		}
		from = rv
	}
	streamList := o.SendInitialEvents != nil && *o.SendInitialEvents
	if streamList && (o.ResourceVersionMatch != metav1.ResourceVersionMatchNotOlderThan || !o.AllowWatchBookmarks) {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("watch %s: sendInitialEvents needs resourceVersionMatch=NotOlderThan and allowWatchBookmarks", gvr.Resource))
	}

	sel, err := newSelection(gvr, o)
	if err != nil {
		return nil, err
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if from > s.rv {
		return nil, tooLargeResourceVersion(from, s.rv)
	}
	w := newWatcher(s, gvr, ns, sel)
	switch {
	case streamList || from == 0:
		if err := s.sendCurrent(w, gvr, ns, streamList); err != nil {
			return nil, err
		}
	default:
		h := s.history[gvr]
		if h != nil && from < h.since {
			return nil, apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d (%d)", from, h.since))
		}
		if h != nil {
			h.after(from, func(e storedEvent) {
				if ev, ok := w.event(e); ok {
					w.send(ev, false)
				}
			})
		}
	}
	if s.watchers[gvr] == nil {
		s.watchers[gvr] = map[*watcher]struct{}{}
	}
	s.watchers[gvr][w] = struct{}{}
	go w.run()
	return w, nil
}

// sendCurrent queues an ADDED event for each object of gvr in ns and, when
// bookmark is set, the bookmark that ends a streamed list. The caller holds
// s.mu.
func (s *store) sendCurrent(w *watcher, gvr schema.GroupVersionResource, ns string, bookmark bool) error {
	gvk, err := s.kindOf(gvr)
	if err != nil {
		return err
	}
	list, err := s.objects.List(gvr, gvk, ns)
	if err != nil {
		return err
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return err
	}
	for _, item := range items {
		if w.sel.matches(item) {
			w.send(watch.Event{Type: watch.Added, Object: item}, false)
		}
	}
	if !bookmark {
		return nil
	}
	obj, err := scheme.Scheme.New(gvk)
	if err != nil {
		return err
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return err
	}
	m.SetResourceVersion(strconv.FormatInt(s.rv, 10))
	m.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
	w.send(watch.Event{Type: watch.Bookmark, Object: obj}, false)
	return nil
}

// kindOf returns the kind served as gvr: the kind of the objects written
// to it, or else the scheme's kind whose conventional resource name gvr is.
// The caller holds s.mu.
func (s *store) kindOf(gvr schema.GroupVersionResource) (schema.GroupVersionKind, error) {
	if gvk, ok := s.kinds[gvr]; ok {
		return gvk, nil
	}
	for gvk := range scheme.Scheme.AllKnownTypes() {
		if gvk.Group != gvr.Group || gvk.Version != gvr.Version {
			continue
		}
		if r, _ := meta.UnsafeGuessKindToResource(gvk); r == gvr {
			s.kinds[gvr] = gvk
			return gvk, nil
		}
	}
	return schema.GroupVersionKind{}, apierrors.NewNotFound(gvr.GroupResource(), "")
}

// stop forgets w; its events are no longer queued.
func (s *store) stop(w *watcher) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.watchers[w.gvr], w)
}

// tooLargeResourceVersion is the error an API server gives for a watch
// from a resource version it has not reached; the reflector lists again.
func tooLargeResourceVersion(asked, current int64) error {
	err := apierrors.NewTimeoutError(fmt.Sprintf("Too large resource version: %d, current: %d", asked, current), 1)
	err.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: metav1.CauseTypeResourceVersionTooLarge, Message: "Too large resource version"}}
	return err
}

// watcher is one watch of a store. Writers queue events without waiting;
// run hands them to the reader one at a time, each a copy of its own.
type watcher struct {
	store *store
	gvr   schema.GroupVersionResource
	ns    string
	sel   selection

	result chan watch.Event
	// ended is closed when the watch ends: on Stop, or when the reader fell
	// too far behind.
	ended   chan struct{}
	endOnce sync.Once
	wake    chan struct{}

	mu    sync.Mutex
	queue []watch.Event
}

var _ watch.Interface = (*watcher)(nil)

func newWatcher(s *store, gvr schema.GroupVersionResource, ns string, sel selection) *watcher {
	return &watcher{
		store:  s,
		gvr:    gvr,
		ns:     ns,
		sel:    sel,
		result: make(chan watch.Event),
		ended:  make(chan struct{}),
		wake:   make(chan struct{}, 1),
	}
}

// event returns what w's reader is sent for e, and whether it is sent at
// all: e's own event when the object is selected before and after it,
// ADDED when a change makes the object enter w's selection, DELETED when
// it makes it leave, nothing when it is outside before and after.
func (w *watcher) event(e storedEvent) (watch.Event, bool) {
	if w.ns != metav1.NamespaceAll && w.ns != e.namespace {
		return watch.Event{}, false
	}
	if w.sel.all() {
		return e.event, true
	}
	now := w.sel.matches(e.event.Object)
	if e.event.Type != watch.Modified {
		return e.event, now
	}
	before := w.sel.matches(e.prev)
	switch {
	case now && before:
		return e.event, true
	case now:
		return watch.Event{Type: watch.Added, Object: e.event.Object}, true
	case before:
		// The object's last state the reader may see, at the version of
		// the change that took it away. run copies it before sending.
		left := e.prev.DeepCopyObject()
		if m, err := meta.Accessor(left); err == nil {
			m.SetResourceVersion(strconv.FormatInt(e.rv, 10))
		}
		return watch.Event{Type: watch.Deleted, Object: left}, true
	}
	return watch.Event{}, false
}

// send queues ev. With limited set, a queue already at the store's limit
// ends the watch instead, and send returns false.
func (w *watcher) send(ev watch.Event, limited bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if limited && len(w.queue) >= w.store.queueLimit {
		w.end()
		return false
	}
	w.queue = append(w.queue, ev)
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return true
}

func (w *watcher) end() {
	w.endOnce.Do(func() { close(w.ended) })
}

// run delivers the queued events until the watch ends, then closes the
// result channel; events still queued then are dropped, as a reader that
// resumes from the last resource version it saw gets them again.
func (w *watcher) run() {
	defer close(w.result)
	for {
		select {
		case <-w.ended:
			return
		default:
		}
		w.mu.Lock()
		if len(w.queue) == 0 {
			w.queue = nil // let a burst's backing array go
			w.mu.Unlock()
			select {
			case <-w.wake:
				continue
			case <-w.ended:
				return
			}
		}
		ev := w.queue[0]
		w.queue[0] = watch.Event{}
		w.queue = w.queue[1:]
		w.mu.Unlock()
		ev.Object = ev.Object.DeepCopyObject()
		select {
		case w.result <- ev:
		case <-w.ended:
			return
		}
	}
}

// Stop is part of watch.Interface: the result channel closes soon after.
func (w *watcher) Stop() {
	w.end()
	w.store.stop(w)
}

// ResultChan is part of watch.Interface.
func (w *watcher) ResultChan() <-chan watch.Event { return w.result }
