package explain

import (
	"fmt"

	"k8s.io/klog/v2"
)

// trackerLog is one line a tracker logged while it was fed one object: the
// service view repeats the trackers' own refusals instead of deciding a
// second time what they refuse.
type trackerLog struct {
	msg string
	err error
	// kv holds the line's values by key, as the tracker formatted them
	// (names already through logsafe).
	kv map[string]string
}

// text is the line as a person reads it: the message, then the error and
// the reason the line gives, if any.
func (l trackerLog) text() string {
	s := l.msg
	if l.err != nil {
		s += ": " + l.err.Error()
	}
	if r := l.kv["reason"]; r != "" {
		s += " (" + r + ")"
	}
	return s
}

// captureSink is a klog.LogSink that keeps every line, at every verbosity,
// for the tracker calls of one object.
type captureSink struct {
	lines *[]trackerLog
}

func newCapture() (klog.Logger, *[]trackerLog) {
	var lines []trackerLog
	return klog.New(captureSink{lines: &lines}), &lines
}

func (captureSink) Init(klog.RuntimeInfo) {}

// Enabled is true at every level: the V(2) and V(4) lines say why a port or
// a Service is skipped.
func (captureSink) Enabled(int) bool { return true }

func (s captureSink) Info(_ int, msg string, kv ...any) { s.add(msg, nil, kv) }

func (s captureSink) Error(err error, msg string, kv ...any) { s.add(msg, err, kv) }

func (s captureSink) add(msg string, err error, kv []any) {
	l := trackerLog{msg: msg, err: err, kv: make(map[string]string, len(kv)/2)}
	for i := 0; i+1 < len(kv); i += 2 {
		l.kv[fmt.Sprint(kv[i])] = fmt.Sprint(kv[i+1])
	}
	*s.lines = append(*s.lines, l)
}

// WithValues drops the values: the trackers log through the logger they
// were given, with no values added.
func (s captureSink) WithValues(...any) klog.LogSink { return s }

func (s captureSink) WithName(string) klog.LogSink { return s }
