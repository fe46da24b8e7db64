package manifests

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// nestedList returns a document of depth Lists, one in the other, the
// innermost holding items.
func nestedList(depth int, items ...string) string {
	return strings.Repeat(`{"apiVersion": "v1", "kind": "List", "items": [`, depth) +
		strings.Join(items, ", ") + strings.Repeat("]}", depth) + "\n"
}

const (
	deepService = `{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "deep", "namespace": "x"}}`
	configMap   = `{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}}`
)

func TestNestedLists(t *testing.T) {
	deepest := strings.Repeat("items[0].", maxListDepth) + "items"
	for _, tc := range []struct {
		name         string
		doc          string
		wantObjects  []string
		wantProblems []string
	}{{
		name:        "as deep as allowed",
		doc:         nestedList(maxListDepth, deepService),
		wantObjects: []string{"Service x/deep"},
	}, {
		name:         "one too deep",
		doc:          nestedList(maxListDepth+1, deepService),
		wantProblems: []string{"x.yaml: document 1: " + deepest + ": Lists nested more than 16 deep; their items are skipped"},
	}, {
		// Its items were once decoded again at every level: quadratic.
		name:         "3,000 deep",
		doc:          nestedList(3000, deepService),
		wantProblems: []string{"x.yaml: document 1: " + deepest + ": Lists nested more than 16 deep; their items are skipped"},
	}, {
		name: "bad items are skipped alone",
		doc: `{"apiVersion": "v1", "kind": "List", "items": [` + deepService + `, 7, ` +
			nestedList(1, configMap, strings.Replace(deepService, "deep", "deeper", 1)) + `]}`,
		wantObjects: []string{"Service x/deep", "Service x/deeper"},
		wantProblems: []string{
			"x.yaml: document 1: items[1]: not an object",
			"x.yaml: document 1: items[2].items[0]: unsupported kind ConfigMap (want Service, EndpointSlice, Node or ServiceCIDR)",
		},
	}, {
		name:         "items not an array",
		doc:          `{"apiVersion": "v1", "kind": "List", "items": {"a": 1}}`,
		wantProblems: []string{"x.yaml: document 1: items: not an array"},
	}, {
		name:        "YAML",
		doc:         "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: List\n  items:\n  - " + deepService + "\n",
		wantObjects: []string{"Service x/deep"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			f := (&Source{}).parseFile("x.yaml", []byte(tc.doc), nil)
			var objects, problems []string
			for _, d := range f.docs {
				for _, o := range d.objects {
					objects = append(objects, o.key.String())
				}
			}
			for _, p := range f.problems("x.yaml") {
				problems = append(problems, p.Error())
			}
			if diff := cmp.Diff(tc.wantObjects, objects); diff != "" {
				t.Errorf("objects (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantProblems, problems); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
		})
	}
}

// BenchmarkNestedLists parses a document of nested Lists: the cost grows
// with the document's size, not with size times depth.
func BenchmarkNestedLists(b *testing.B) {
	for _, depth := range []int{100, 1000, 3000} {
		doc := []byte(nestedList(depth, deepService))
		b.Run(fmt.Sprintf("depth%d", depth), func(b *testing.B) {
			b.SetBytes(int64(len(doc)))
			for b.Loop() {
				(&Source{}).parseFile("x.yaml", doc, nil)
			}
		})
	}
}
