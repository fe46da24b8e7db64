package iptables

import (
	"errors"
	"fmt"
	"strings"
)

// MaxRestoreText is the longest text, in bytes, that [AppendRestoreText]
// takes from one object. It keeps every word of a line under
// iptables-restore's 1024-byte word buffer ("Parameter too long!") and
// every line under its 10240-byte line buffer, past which the rest of a
// line would be read as a line of its own. No name the API server accepts
// comes near it: a service port's "namespace/name:port" is at most 143
// bytes.
const MaxRestoreText = 512

// ErrRestoreText is wrapped by the error of [AppendRestoreText] for text
// that no quoting can carry into an iptables-restore line.
var ErrRestoreText = errors.New("text cannot be written for iptables-restore")

// AppendRestoreText appends the concatenation of parts to b for use
// inside a double-quoted word of an iptables-restore line, or refuses it.
// It is the one way text that comes from outside the program (names of
// API objects) reaches a restore payload.
//
// Inside double quotes iptables-restore (1.8.9, add_param_to_argv) takes
// every byte literally except two: '"', which ends the word, and '\',
// which makes the next byte literal. Both are written with a backslash
// before them, so the text can neither end the word nor, through it, the
// rule, the table or the payload. Two bytes cannot be carried at all: a
// newline ends the line before the tokenizer sees it, and a NUL byte ends
// it for iptables-restore, which reads lines as C strings. Text holding
// either, or longer than MaxRestoreText, is refused: b is returned
// unchanged with an error wrapping ErrRestoreText, and the caller must
// leave out what the text was for.
func AppendRestoreText(b []byte, parts ...string) ([]byte, error) {
	if err := CheckRestoreText(parts...); err != nil {
		return b, err
	}
	for _, p := range parts {
		for i := 0; i < len(p); i++ {
			if c := p[i]; c == '"' || c == '\\' {
				b = append(b, '\\', c)
			} else {
				b = append(b, c)
			}
		}
	}
	return b, nil
}

// CheckRestoreText returns the error AppendRestoreText would return for
// the concatenation of parts, or nil, without writing anything: it is the
// refusal half of AppendRestoreText, cheap enough to run on every name at
// every sync.
func CheckRestoreText(parts ...string) error {
	n := 0
	for _, p := range parts {
		n += len(p)
		for _, c := range [...]byte{0, '\n'} {
			if strings.IndexByte(p, c) >= 0 {
				return fmt.Errorf("%w: it holds the byte %q", ErrRestoreText, c)
			}
		}
	}
	if n > MaxRestoreText {
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrRestoreText, n, MaxRestoreText)
	}
	return nil
}

// AppendRestoreWord appends the concatenation of parts to b as one word of
// an iptables-restore line: bare when it is made only of letters, digits
// and "-./:_" and starts with a letter or digit (so it reads as neither an
// option nor a negation), otherwise double-quoted through
// [AppendRestoreText]. It refuses what AppendRestoreText refuses, in the
// same way.
func AppendRestoreWord(b []byte, parts ...string) ([]byte, error) {
	if bareWord(parts) {
		for _, p := range parts {
			b = append(b, p...)
		}
		return b, nil
	}
	start := len(b)
	b, err := AppendRestoreText(append(b, '"'), parts...)
	if err != nil {
		return b[:start], err
	}
	return append(b, '"'), nil
}

func bareWord(parts []string) bool {
	first, n := true, 0
	for _, p := range parts {
		n += len(p)
		for i := 0; i < len(p); i++ {
			c := p[i]
			alnum := (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
			if first && !alnum {
				return false
			}
			first = false
			if !alnum && c != '-' && c != '.' && c != '/' && c != ':' && c != '_' {
				return false
			}
		}
	}
	return n > 0 && n <= MaxRestoreText
}
