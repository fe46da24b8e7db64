// Package logsafe names untrusted text in log lines so that it cannot forge
// a line or hide in one. Names, addresses and other strings from the API
// (or from a caller's own objects, or a --manifests file) can hold newlines,
// carriage returns and terminal escapes; klog writes an ObjectRef's
// namespace and name as they are, so a Service named "a\nE1127 ..." would
// print a second, forged log line. Every value here prints escaped in the
// text format and as plain JSON strings in the JSON format.
package logsafe

import (
	"bytes"
	"strconv"
	"unicode/utf8"

	"k8s.io/klog/v2"
)

// ObjectRef is klog.ObjectRef whose text form escapes what klog's does not.
// Use it where klog.KObj or klog.KRef would name an object in a log line.
type ObjectRef struct {
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
}

// KObj names obj, as klog.KObj does; a nil obj gives the empty reference.
func KObj(obj klog.KMetadata) ObjectRef {
	if obj == nil {
		return ObjectRef{}
	}
	// A typed nil pointer inside the interface panics on its methods.
	defer func() { _ = recover() }()
	return ObjectRef{Namespace: obj.GetNamespace(), Name: obj.GetName()}
}

// KRef names the object namespace/name, as klog.KRef does.
func KRef(namespace, name string) ObjectRef {
	return ObjectRef{Namespace: namespace, Name: name}
}

// String returns "namespace/name" (or "name" without a namespace), each
// part escaped as Quote escapes it when it is not plain text.
func (r ObjectRef) String() string {
	if r.Namespace == "" {
		return Quote(r.Name)
	}
	return Quote(r.Namespace) + "/" + Quote(r.Name)
}

// WriteText is how klog's text format writes the reference: quoted, as it
// writes every other string value.
func (r ObjectRef) WriteText(b *bytes.Buffer) {
	b.WriteString(strconv.Quote(r.String()))
}

// MarshalLog is what a structured (JSON) logger encodes; its encoder
// escapes the strings itself.
func (r ObjectRef) MarshalLog() any {
	return struct {
		Namespace string `json:"namespace,omitempty"`
		Name      string `json:"name"`
	}{r.Namespace, r.Name}
}

// Quote returns s unchanged when it is plain text (printable ASCII without
// quotes or backslashes), else s quoted as a Go string literal with every
// non-ASCII or non-printable rune escaped, so that it holds no line break,
// carriage return or terminal escape and cannot be mistaken for plain text.
func Quote(s string) string {
	if plain(s) {
		return s
	}
	return strconv.QuoteToASCII(s)
}

func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return utf8.ValidString(s)
}
