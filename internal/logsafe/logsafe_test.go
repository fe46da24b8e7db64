package logsafe

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2/textlogger"
)

type meta struct{ ns, name string }

func (m meta) GetNamespace() string { return m.ns }
func (m meta) GetName() string      { return m.name }

func TestQuote(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"web", "web"},
		{"kube-system", "kube-system"},
		{"", ""},
		{"a\nE1127 forged", `"a\nE1127 forged"`},
		{"a\rb", `"a\rb"`},
		{"\x1b[31mred", `"\x1b[31mred"`},
		{`say "hi"`, `"say \"hi\""`},
		{"naïve", `"na\u00efve"`},
		{"\xff", `"\xff"`},
	} {
		if got := Quote(tc.in); got != tc.want {
			t.Errorf("Quote(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// TestTextLog checks what matters: a name with a line break cannot start a
// line of its own in klog's text output, where klog.KObj would let it.
func TestTextLog(t *testing.T) {
	var b bytes.Buffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&b)))
	forged := meta{ns: "ns\r", name: "a\nE1127 00:00:00.000000       1 forged.go:1] \"owned\""}
	logger.Error(nil, "Ignoring invalid service", "service", KObj(forged), "port", Quote("p\nq"))
	out := b.String()
	if n := strings.Count(out, "\n"); n != 1 {
		t.Fatalf("log line split into %d lines:\n%s", n, out)
	}
	if strings.Contains(out, "\r") {
		t.Fatalf("log line holds a raw carriage return: %q", out)
	}
	if !strings.Contains(out, `service="\"ns\\r\"/\"a\\nE1127`) {
		t.Errorf("reference not escaped as expected: %s", out)
	}
	b.Reset()
	logger.Info("Syncing", "service", KRef("default", "web"))
	if !strings.Contains(b.String(), `service="default/web"`) {
		t.Errorf("a plain reference should print as klog's does: %s", b.String())
	}
}

func TestMarshalLog(t *testing.T) {
	var _ logr.Marshaler = ObjectRef{}
	got, err := json.Marshal(KRef("ns", "a\nb").MarshalLog())
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"namespace":"ns","name":"a\nb"}`; string(got) != want {
		t.Errorf("MarshalLog JSON = %s, want %s", got, want)
	}
	if got := KObj(nil); got != (ObjectRef{}) {
		t.Errorf("KObj(nil) = %#v", got)
	}
	var nilPtr *nilMeta
	if got := KObj(nilPtr); got != (ObjectRef{}) {
		t.Errorf("KObj(typed nil) = %#v", got)
	}
}

type nilMeta struct{ ns string }

func (m *nilMeta) GetNamespace() string { return m.ns }
func (m *nilMeta) GetName() string      { return m.ns }
