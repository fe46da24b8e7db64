// Package manifests runs a proxier against YAML files instead of an API
// server: Services, EndpointSlices, Nodes and ServiceCIDRs read from a file or a
// directory are loaded into a client-go fake clientset, so the informers,
// listers and event handlers a proxier uses are the real ones, and edits to
// the files flow through as add, update and delete events.
//
// The embedded cluster behaves as an API server does where a proxier can
// tell: lists and watches apply label and field selectors (an object that
// a change moves into or out of a watch's selection is ADDED or DELETED
// for it), and objects that an API server's validation would refuse, on
// create or on update, are refused with a [Problem] naming them while the
// rest load. A selector that does not parse makes client-go's fake
// clientset panic before it reaches the store; a selector with a field the
// API server cannot select by is refused with 400 Bad Request.
//
// It is for demos, tests and scripting (the example proxier's --manifests
// flag), not for production: the fake clientset keeps everything in memory.
package manifests

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/internal/logsafe"
)

// Problem is one document that could not be loaded: bad YAML, an object of
// a kind this package does not serve, an object without a name, or an
// object that an API server would refuse to create or to update to. The
// other documents still load; an object refused on update keeps its
// previous state, as in an API server.
type Problem struct {
	// File is the path of the file the document is in.
	File string
	// Document is the 1-based position of the document in its file.
	Document int
	// Err says what is wrong.
	Err error
	// Kind, Namespace and Name name the object that was refused; Kind is
	// empty when the document could not be read as an object.
	Kind, Namespace, Name string
}

// Error returns "file: document N: what is wrong", the file name escaped
// as logsafe.Quote escapes it.
func (p Problem) Error() string {
	return fmt.Sprintf("%s: document %d: %v", logsafe.Quote(p.File), p.Document, p.Err)
}

// LogProblems logs each problem as an error with its file and document,
// and with the object when one was refused. Every text that comes from the
// manifests (names, file names, parser messages) is escaped, so that a
// name holding a line break cannot start a log line of its own.
func LogProblems(logger klog.Logger, problems []Problem) {
	for _, p := range problems {
		var err error
		if p.Err != nil {
			err = escapedError{p.Err}
		}
		if p.Kind != "" {
			logger.Error(err, "Refusing an invalid manifest object", "kind", p.Kind, "object", logsafe.KRef(p.Namespace, p.Name),
				"file", logsafe.Quote(p.File), "document", p.Document)
			continue
		}
		logger.Error(err, "Skipping a manifest document", "file", logsafe.Quote(p.File), "document", p.Document)
	}
}

// escapedError is an error whose text is escaped when it holds a control
// character or is not valid UTF-8: klog writes an error's text as it is,
// spreading one with a line break over several lines.
type escapedError struct{ err error }

func (e escapedError) Error() string {
	s := e.err.Error()
	if !utf8.ValidString(s) || strings.ContainsFunc(s, unicode.IsControl) {
		return logsafe.Quote(s)
	}
	return s
}

func (e escapedError) Unwrap() error { return e.err }

// objectKey identifies an object across reloads.
type objectKey struct {
	kind, namespace, name string
}

// String returns "Kind namespace/name", the names escaped as in a log line.
func (k objectKey) String() string {
	return k.kind + " " + logsafe.KRef(k.namespace, k.name).String()
}

// Source is a fake cluster fed from manifest files. Create one with [New];
// its Client is what informers are built on.
type Source struct {
	path   string
	client *clientset
	// mu serialises reloads: Reload may be called while Watch runs.
	mu      sync.Mutex
	current map[objectKey]runtime.Object
	// files caches what each file held when it was last parsed, so that a
	// reload parses only the files whose bytes changed, and in those only
	// the documents whose bytes changed.
	files map[string]*parsedFile
	// decoded, when set, is called for each document decoded (not taken
	// from the cache), with its file and 1-based position; for tests.
	decoded func(file string, document int)
}

// parsedFile is what one manifest file held when it was last read. It
// keeps digests of the file and of its documents, not their text: an edit
// of one document in a large file is found by its digest, and only that
// document is decoded again.
type parsedFile struct {
	sum  digest
	docs []parsedDoc
}

// digest is the SHA-256 of a file's or a document's bytes. A collision
// would hide an edit; SHA-256 makes one out of reach even of a writer who
// tries.
type digest [sha256.Size]byte

// parsedDoc is what one document of a file held: its objects (nil for a
// document of comments alone) and its problems, at the position the
// document had when it was decoded. Both are shared by the parses that
// find the same bytes again, and never changed.
type parsedDoc struct {
	sum      digest
	objects  []keyedObject
	problems []Problem
	// reusable is false for the document that ended the file because it
	// could not be read: its error is about what follows it too.
	reusable bool
}

// problems returns the problems of f's documents, placed in file name at
// the documents' positions in f.
func (f *parsedFile) problems(name string) []Problem {
	var out []Problem
	for i, d := range f.docs {
		for _, p := range d.problems {
			p.File, p.Document = name, i+1
			out = append(out, p)
		}
	}
	return out
}

// keyedObject is an object decoded from a document, and its key.
type keyedObject struct {
	key objectKey
	obj runtime.Object
}

// New reads the manifests at path (a YAML file, or a directory whose *.yaml,
// *.yml and *.json files are read in name order, not recursively) into a
// new fake clientset. Documents that cannot be loaded are returned as
// problems and skipped; the error is non-nil only when path itself cannot
// be read.
func New(ctx context.Context, path string) (*Source, []Problem, error) {
	s := &Source{path: path, client: newClientset(), current: map[objectKey]runtime.Object{}, files: map[string]*parsedFile{}}
	problems, err := s.Reload(ctx)
	if err != nil {
		return nil, problems, err
	}
	return s, problems, nil
}

// Client returns the fake clientset that holds the manifests' objects.
func (s *Source) Client() kubernetes.Interface { return s.client }

// Path returns the file or directory the source reads.
func (s *Source) Path() string { return s.path }

// Reload reads the manifests again and brings the clientset in line with
// them: objects that are new are created, changed ones updated, and ones no
// longer in any file deleted, each producing the watch event a real API
// server would send. Objects whose content did not change cause no event.
// When path cannot be read, nothing is changed and the error is returned.
// An object an API server would refuse is returned as a problem naming it
// and is not created, or, when it exists, keeps its previous state.
//
// Reload never waits for the watches to be read, so an edit of any size
// applies at once, informers started or not. When ctx ends part way, the
// objects not applied yet are left as they were and ctx's error is
// returned; the next Reload applies them.
func (s *Source) Reload(ctx context.Context) ([]Problem, error) {
	return s.reloadFiles(ctx, nil)
}

// reloadFiles is Reload reading, with dirty non-nil, only the files it
// names and the files not read before (see readPath).
func (s *Source) reloadFiles(ctx context.Context, dirty map[string]bool) ([]Problem, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	problems, err := s.reload(ctx, dirty)
	// Refusals join the documents' problems, in file and document order.
	sortProblems(problems)
	return problems, err
}

func (s *Source) reload(ctx context.Context, dirty map[string]bool) ([]Problem, error) {
	// The fake clientset records every call it serves and keeps the
	// records for tests to inspect; nothing here does, and a long-running
	// --manifests proxier would keep every object it ever changed.
	defer s.client.ClearActions()
	desired, where, problems, err := s.readPath(dirty)
	if err != nil {
		return problems, err
	}
	logger := klog.FromContext(ctx)
	// Objects of files that did not change are the very ones applied last
	// time; only the others are compared.
	var changed []objectKey
	for k, obj := range desired {
		if old, ok := s.current[k]; !ok || (old != obj && !apiequality.Semantic.DeepEqual(old, obj)) {
			changed = append(changed, k)
		}
	}
	sort.Slice(changed, func(i, j int) bool { return changed[i].String() < changed[j].String() })
	var errs []error
	for _, k := range changed {
		if err := ctx.Err(); err != nil {
			return problems, err
		}
		obj := desired[k]
		old, exists := s.current[k]
		if err := validate(obj, old); err != nil {
			// As an API server refuses it: a new object is not created, an
			// existing one keeps its state.
			at := where[k]
			problems = append(problems, Problem{File: at.file, Document: at.document, Err: err, Kind: k.kind, Namespace: k.namespace, Name: k.name})
			continue
		}
		if err := s.apply(ctx, obj, exists); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", k, err))
			continue
		}
		logger.V(4).Info("Manifest object applied", "kind", k.kind, "object", logsafe.KRef(k.namespace, k.name), "update", exists)
		s.current[k] = obj
	}
	for k := range s.current {
		if _, ok := desired[k]; ok {
			continue
		}
		if err := ctx.Err(); err != nil {
			return problems, err
		}
		if err := s.delete(ctx, k); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", k, err))
			continue
		}
		logger.V(4).Info("Manifest object deleted", "kind", k.kind, "object", logsafe.KRef(k.namespace, k.name))
		delete(s.current, k)
	}
	return problems, errors.Join(errs...)
}

// validate returns why an API server would refuse obj: on create when old
// is nil, else on update from old.
func validate(obj, old runtime.Object) error {
	if old == nil {
		return validateCreate(obj)
	}
	return validateUpdate(obj, old)
}

func (s *Source) apply(ctx context.Context, obj runtime.Object, update bool) error {
	var err error
	create, upd := metav1.CreateOptions{}, metav1.UpdateOptions{}
	switch o := obj.DeepCopyObject().(type) {
	case *v1.Service:
		c := s.client.CoreV1().Services(o.Namespace)
		if update {
			_, err = c.Update(ctx, o, upd)
		} else {
			_, err = c.Create(ctx, o, create)
		}
	case *discoveryv1.EndpointSlice:
		c := s.client.DiscoveryV1().EndpointSlices(o.Namespace)
		if update {
			_, err = c.Update(ctx, o, upd)
		} else {
			_, err = c.Create(ctx, o, create)
		}
	case *v1.Node:
		c := s.client.CoreV1().Nodes()
		if update {
			_, err = c.Update(ctx, o, upd)
		} else {
			_, err = c.Create(ctx, o, create)
		}
	case *networkingv1.ServiceCIDR:
		c := s.client.NetworkingV1().ServiceCIDRs()
		if update {
			_, err = c.Update(ctx, o, upd)
		} else {
			_, err = c.Create(ctx, o, create)
		}
	default:
		err = fmt.Errorf("unsupported type %T", obj)
	}
	return err
}

func (s *Source) delete(ctx context.Context, k objectKey) error {
	opts := metav1.DeleteOptions{}
	switch k.kind {
	case "Service":
		return s.client.CoreV1().Services(k.namespace).Delete(ctx, k.name, opts)
	case "EndpointSlice":
		return s.client.DiscoveryV1().EndpointSlices(k.namespace).Delete(ctx, k.name, opts)
	case "Node":
		return s.client.CoreV1().Nodes().Delete(ctx, k.name, opts)
	case "ServiceCIDR":
		return s.client.NetworkingV1().ServiceCIDRs().Delete(ctx, k.name, opts)
	}
	return fmt.Errorf("unsupported kind %s", k.kind)
}

// files lists the manifest files at path.
func files(path string) ([]string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() || !isManifestName(e.Name()) {
			continue
		}
		out = append(out, filepath.Join(path, e.Name()))
	}
	return out, nil
}

func isManifestName(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false // editor swap files and dotfiles
	}
	switch filepath.Ext(name) {
	case ".yaml", ".yml", ".json":
		return true
	}
	return false
}

// place is where an object is defined: a file and a 1-based document.
type place struct {
	file     string
	document int
}

// readPath reads the manifests at the source's path, parsing only the files
// whose content changed since the last call. With dirty non-nil, only the
// files it names, and files not read before, are read: the others are
// taken to be as they were (the watch knows which files it saw change). It
// returns the objects, where each is defined, and the documents' problems.
func (s *Source) readPath(dirty map[string]bool) (map[objectKey]runtime.Object, map[objectKey]place, []Problem, error) {
	names, err := files(s.path)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("manifests %q: %w", s.path, err)
	}
	parsed := make(map[string]*parsedFile, len(names))
	for _, name := range names {
		prev := s.files[name]
		if prev != nil && dirty != nil && !dirty[name] {
			parsed[name] = prev
			continue
		}
		data, err := os.ReadFile(name)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("manifests %q: %w", name, err)
		}
		parsed[name] = s.parseFile(name, data, prev)
	}
	s.files = parsed

	objs := map[objectKey]runtime.Object{}
	where := map[objectKey]place{}
	var problems []Problem
	for _, name := range names {
		f := parsed[name]
		problems = append(problems, f.problems(name)...)
		for i, d := range f.docs {
			document := i + 1
			for _, o := range d.objects {
				if prev, dup := where[o.key]; dup {
					problems = append(problems, Problem{File: name, Document: document,
						Err: fmt.Errorf("%s is also defined at %s document %d; the later one wins", o.key, logsafe.Quote(prev.file), prev.document)})
				}
				where[o.key] = place{name, document}
				objs[o.key] = o.obj
			}
		}
	}
	return objs, where, problems, nil
}

// sortProblems orders problems by file and document, stably.
func sortProblems(problems []Problem) {
	sort.SliceStable(problems, func(i, j int) bool {
		if problems[i].File != problems[j].File {
			return problems[i].File < problems[j].File
		}
		return problems[i].Document < problems[j].Document
	})
}

// parseFile parses the documents of one manifest file, taking from prev,
// the file's previous parse (nil for none), the documents whose bytes did
// not change: only the others are decoded.
func (s *Source) parseFile(name string, data []byte, prev *parsedFile) *parsedFile {
	sum := digest(sha256.Sum256(data))
	if prev != nil && prev.sum == sum {
		return prev
	}
	known := map[digest]*parsedDoc{}
	if prev != nil {
		for i := range prev.docs {
			if d := &prev.docs[i]; d.reusable {
				known[d.sum] = d
			}
		}
	}
	f := &parsedFile{sum: sum}
	for i, doc := range splitDocuments(data) {
		if doc.err != nil {
			f.docs = append(f.docs, parsedDoc{problems: []Problem{{Err: doc.err}}})
			continue
		}
		d := parsedDoc{sum: docDigest(doc.data), reusable: true}
		if k, ok := known[d.sum]; ok {
			f.docs = append(f.docs, *k)
			continue
		}
		if s.decoded != nil {
			s.decoded(name, i+1)
		}
		d.objects, d.problems = decodeDocument(doc.data)
		f.docs = append(f.docs, d)
	}
	return f
}

// docDigest is the digest of a document's bytes without the separator
// line the YAML reader leaves at the start of a file's first document, so
// that the first document is found again when another is put before it.
func docDigest(data []byte) digest {
	if rest, ok := bytes.CutPrefix(data, []byte("---")); ok {
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			data = rest[i+1:]
		}
	}
	return sha256.Sum256(data)
}

// decodeDocument decodes the objects of one document; its problems name
// neither file nor document, which the caller fills in.
func decodeDocument(data []byte) ([]keyedObject, []Problem) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, nil
	}
	var objects []keyedObject
	var problems []Problem
	for _, obj := range decode(data, &problems) {
		k, err := keyOf(obj)
		if err != nil {
			problems = append(problems, Problem{Err: err})
			continue
		}
		objects = append(objects, keyedObject{key: k, obj: obj})
	}
	return objects, problems
}

type document struct {
	data []byte
	err  error
}

// splitDocuments cuts a multi-document YAML (or a JSON) file into its
// documents, as client-go's YAML reader does. A document that cannot be
// read ends the file: the YAML reader cannot resynchronise after it.
//
// A file without carriage returns is cut in place, without copying: the
// reader copies every line, which costs more than the rest of a reload
// that decodes one document of a large file. The documents are the
// reader's, but that the last one of a file that does not end with a line
// break has none either.
func splitDocuments(data []byte) []document {
	if bytes.IndexByte(data, '\r') >= 0 {
		return readDocuments(data) // the reader drops the \r of \r\n
	}
	var docs []document
	start := 0 // of the document being read
	for pos := 0; pos < len(data); {
		next := len(data)
		if i := bytes.IndexByte(data[pos:], '\n'); i >= 0 {
			next = pos + i + 1
		}
		line := data[pos:next]
		if rest, ok := bytes.CutPrefix(line, []byte("---")); ok {
			// As the reader, which allows only a comment after a
			// separator, and keeps one that opens the file in the first
			// document.
			if rest = bytes.TrimSpace(rest); len(rest) > 0 && rest[0] != '#' {
				return append(docs, document{err: fmt.Errorf("invalid Yaml document separator: %s", rest)})
			}
			if pos > start {
				docs = append(docs, document{data: data[start:pos]})
				start = next
			}
		}
		pos = next
	}
	if start < len(data) {
		docs = append(docs, document{data: data[start:]})
	}
	return docs
}

// readDocuments is splitDocuments through client-go's YAML reader.
func readDocuments(data []byte) []document {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs []document
	for {
		d, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			return append(docs, document{err: err})
		}
		docs = append(docs, document{data: d})
	}
}

// maxListDepth is how deeply v1 Lists may nest in one document: a List in
// a document's List is at depth 2. The items of Lists nested deeper are
// skipped with a problem.
const maxListDepth = 16

// decode turns one document into objects; a v1 List yields its items, and
// the items of the Lists among them. Problems are recorded without a
// position, which the caller fills in.
func decode(data []byte, problems *[]Problem) []runtime.Object {
	report := func(err error) {
		*problems = append(*problems, Problem{Err: err})
	}
	jsonData, err := utilyaml.ToJSON(data)
	if err != nil {
		report(err)
		return nil
	}
	if string(bytes.TrimSpace(jsonData)) == "null" {
		return nil // only comments
	}
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := json.Unmarshal(jsonData, &head); err != nil || !isList(head.APIVersion, head.Kind) {
		obj, err := decodeObject(jsonData)
		if err != nil {
			report(err)
			return nil
		}
		return []runtime.Object{obj}
	}
	// The document is parsed once; each object in it is encoded on its
	// own and decoded. Decoding each List's items from their text instead
	// would parse an object once for every List around it: quadratic in
	// the nesting.
	dec := json.NewDecoder(bytes.NewReader(jsonData))
	dec.UseNumber() // numbers go back out as they came in
	var list map[string]any
	if err := dec.Decode(&list); err != nil {
		report(err)
		return nil
	}
	var out []runtime.Object
	listItems(list, "", 1, &out, report)
	return out
}

// isList tells whether a document or item with these apiVersion and kind
// fields is a v1 List, the only kind of list a manifest may hold.
func isList(apiVersion, kind any) bool {
	return apiVersion == "v1" && kind == "List"
}

// listItems decodes the items of list, which is at the given depth and
// path ("" for the document, "items[2]." for a List that is its third
// item), into out, and reports what cannot be decoded.
func listItems(list map[string]any, path string, depth int, out *[]runtime.Object, report func(error)) {
	if depth > maxListDepth {
		report(fmt.Errorf("%sitems: Lists nested more than %d deep; their items are skipped", path, maxListDepth))
		return
	}
	items, ok := list["items"].([]any)
	if !ok && list["items"] != nil {
		report(fmt.Errorf("%sitems: not an array", path))
		return
	}
	for i, item := range items {
		where := fmt.Sprintf("%sitems[%d]", path, i)
		obj, ok := item.(map[string]any)
		if !ok {
			report(fmt.Errorf("%s: not an object", where))
			continue
		}
		if isList(obj["apiVersion"], obj["kind"]) {
			listItems(obj, where+".", depth+1, out, report)
			continue
		}
		data, err := json.Marshal(obj)
		if err == nil {
			var o runtime.Object
			if o, err = decodeObject(data); err == nil {
				*out = append(*out, o)
				continue
			}
		}
		report(fmt.Errorf("%s: %w", where, err))
	}
}

// decodeObject decodes one Service, EndpointSlice, Node or ServiceCIDR
// from JSON.
func decodeObject(data []byte) (runtime.Object, error) {
	obj, gvk, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		return nil, err
	}
	switch obj.(type) {
	case *v1.Service, *discoveryv1.EndpointSlice, *v1.Node, *networkingv1.ServiceCIDR:
		return obj, nil
	}
	return nil, fmt.Errorf("unsupported kind %s (want Service, EndpointSlice, Node or ServiceCIDR)", gvk.GroupKind())
}

// keyOf returns the key of obj, a Service, EndpointSlice, Node or
// ServiceCIDR, after putting a namespaced one in the default namespace
// when it names none and clearing its resource version.
func keyOf(obj runtime.Object) (objectKey, error) {
	var k objectKey
	var meta metav1.Object
	switch o := obj.(type) {
	case *v1.Service:
		k.kind, meta = "Service", o
	case *discoveryv1.EndpointSlice:
		k.kind, meta = "EndpointSlice", o
	case *v1.Node:
		k.kind, meta = "Node", o
	case *networkingv1.ServiceCIDR:
		k.kind, meta = "ServiceCIDR", o
	}
	if meta.GetName() == "" {
		return k, fmt.Errorf("%s has no metadata.name", k.kind)
	}
	k.name = meta.GetName()
	// A manifest saved from a cluster (kubectl get -o yaml) carries that
	// cluster's resource version, which a create refuses; the embedded
	// cluster numbers its own.
	meta.SetResourceVersion("")
	// Nodes and ServiceCIDRs are cluster-scoped: the API server keeps no
	// namespace for them.
	if k.kind == "Node" || k.kind == "ServiceCIDR" {
		meta.SetNamespace("")
	} else {
		if meta.GetNamespace() == "" {
			meta.SetNamespace(metav1.NamespaceDefault)
		}
		k.namespace = meta.GetNamespace()
	}
	return k, nil
}
