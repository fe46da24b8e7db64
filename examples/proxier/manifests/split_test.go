package manifests

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestSplitDocumentsAsTheReader checks that the in-place split cuts files
// as client-go's YAML reader does: the same documents, byte for byte, but
// for the line break the reader adds to a file's last line, and the same
// error where a separator carries more than a comment.
func TestSplitDocumentsAsTheReader(t *testing.T) {
	for _, in := range []string{
		"",
		"a: 1\n",
		"a: 1",
		"---\na: 1\n---\nb: 2\n",
		"---\na: 1\n---\nb: 2",
		"a: 1\n--- # comment\nb: 2\n---\n",
		"---\n---\n---\na: 1\n",
		"a: 1\n---\n\n---\nb: 2\n",
		"a: 1\n----\nb: 2\n",
		"a: 1\n--- x\nb: 2\n",
		"a: |\n  ---\n  x\n",
		"a: 1\n---   \t\nb: 2\n---",
		"{\"a\": 1}\n---\n{\"b\": 2}\n",
		"a: 1\n \n---\n",
	} {
		want := readDocuments([]byte(in))
		got := splitDocuments([]byte(in))
		norm := func(docs []document) []string {
			var out []string
			for i, d := range docs {
				if d.err != nil {
					out = append(out, "error: "+d.err.Error())
					continue
				}
				s := string(d.data)
				if i == len(docs)-1 && !bytes.HasSuffix(d.data, []byte("\n")) {
					s += "\n"
				}
				out = append(out, s)
			}
			return out
		}
		if diff := cmp.Diff(norm(want), norm(got)); diff != "" {
			t.Errorf("%q: documents (-reader +split):\n%s", in, diff)
		}
	}
}
