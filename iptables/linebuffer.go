package iptables

// LineBuffer builds iptables-restore input one line at a time from words,
// without allocating per line once its buffer has grown to size: words
// are copied into one growing byte slice, separated by single spaces, and
// every line ends with "\n". It counts the lines it was given.
//
// A discarding LineBuffer ([NewDiscardLineBuffer]) counts lines and keeps
// nothing: a partial sync writes the chains it leaves unchanged there, to
// know how many rules they have without paying for their bytes.
//
// Words are written as given; a word containing spaces or quotes must be
// quoted by the caller ("\"my comment\""), as iptables-restore would read
// it, and text from outside the program must go through
// [AppendRestoreWord], which quotes it or refuses it. The zero LineBuffer is an empty, keeping buffer ready to use. A
// LineBuffer is not safe for concurrent use.
type LineBuffer struct {
	buf     []byte
	lines   int
	discard bool
	// open is set while a line started by Words is not ended yet.
	open bool
}

// NewLineBuffer returns an empty LineBuffer that keeps what is written.
func NewLineBuffer() *LineBuffer { return &LineBuffer{} }

// NewDiscardLineBuffer returns a LineBuffer that only counts lines: Bytes
// returns nil and Len 0 however much is written.
func NewDiscardLineBuffer() *LineBuffer { return &LineBuffer{discard: true} }

// Write writes one line made of words and ends it. With no words it
// writes an empty line, which iptables-restore ignores but which counts as
// a line. If a line started with [LineBuffer.Words] is open, words are
// added to it and it is ended.
func (b *LineBuffer) Write(words ...string) {
	b.Words(words...)
	b.EndLine()
}

// WriteBytes writes line (which should not contain "\n") as one line, as
// [LineBuffer.Write] does with a single word.
func (b *LineBuffer) WriteBytes(line []byte) {
	if !b.discard {
		if b.open && len(line) > 0 {
			b.buf = append(b.buf, ' ')
		}
		b.buf = append(b.buf, line...)
	}
	b.open = true
	b.EndLine()
}

// Words adds words to the current line without ending it, starting a line
// if none is open, so that a rule can be written from parts without
// joining slices:
//
//	b.Words("-A", string(chain)).Words(args...).EndLine()
//
// It returns b.
func (b *LineBuffer) Words(words ...string) *LineBuffer {
	if b.discard {
		if len(words) > 0 {
			b.open = true
		}
		return b
	}
	for _, w := range words {
		if b.open {
			b.buf = append(b.buf, ' ')
		}
		b.buf = append(b.buf, w...)
		b.open = true
	}
	return b
}

// EndLine ends the current line (an empty line if none was started) and
// counts it.
func (b *LineBuffer) EndLine() {
	if !b.discard {
		b.buf = append(b.buf, '\n')
	}
	b.open = false
	b.lines++
}

// Lines returns the number of lines ended since the buffer was made or
// reset.
func (b *LineBuffer) Lines() int { return b.lines }

// Len returns the number of bytes written (0 for a discarding buffer).
func (b *LineBuffer) Len() int { return len(b.buf) }

// Bytes returns what was written, including an unended line at the end.
// The slice aliases the buffer: it is valid until the next write or Reset.
// A discarding buffer returns nil.
func (b *LineBuffer) Bytes() []byte { return b.buf }

// String returns what was written as a string (a copy).
func (b *LineBuffer) String() string { return string(b.buf) }

// Reset empties the buffer and its line count, keeping the memory for
// reuse.
func (b *LineBuffer) Reset() {
	b.buf = b.buf[:0]
	b.lines = 0
	b.open = false
}

// Grow makes room for n more bytes without reallocating.
func (b *LineBuffer) Grow(n int) {
	if b.discard || n <= cap(b.buf)-len(b.buf) {
		return
	}
	nb := make([]byte, len(b.buf), 2*cap(b.buf)+n)
	copy(nb, b.buf)
	b.buf = nb
}
