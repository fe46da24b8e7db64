package iptables

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestLineBuffer(t *testing.T) {
	for _, tc := range []struct {
		name      string
		write     func(b *LineBuffer)
		want      string
		wantLines int
	}{
		{
			name:      "words",
			write:     func(b *LineBuffer) { b.Write("-A", "KUBE-SERVICES", "-j", "ACCEPT") },
			want:      "-A KUBE-SERVICES -j ACCEPT\n",
			wantLines: 1,
		},
		{
			name: "parts",
			write: func(b *LineBuffer) {
				args := []string{"-m", "comment", "--comment", `"a b"`}
				b.Words("-A", "X").Words(args...).Words().EndLine()
				b.Words("COMMIT")
				b.EndLine()
			},
			want:      "-A X -m comment --comment \"a b\"\nCOMMIT\n",
			wantLines: 2,
		},
		{
			name:      "empty lines count",
			write:     func(b *LineBuffer) { b.Write(); b.EndLine() },
			want:      "\n\n",
			wantLines: 2,
		},
		{
			name: "bytes",
			write: func(b *LineBuffer) {
				b.WriteBytes([]byte("*nat"))
				b.Words("-A", "X")
				b.WriteBytes([]byte("-j DROP"))
			},
			want:      "*nat\n-A X -j DROP\n",
			wantLines: 2,
		},
		{
			name:      "an open line is in Bytes but not counted",
			write:     func(b *LineBuffer) { b.Write("a"); b.Words("b", "c") },
			want:      "a\nb c",
			wantLines: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewLineBuffer()
			tc.write(b)
			if diff := cmp.Diff(tc.want, string(b.Bytes())); diff != "" {
				t.Errorf("Bytes (-want +got):\n%s", diff)
			}
			if b.String() != tc.want || b.Len() != len(tc.want) || b.Lines() != tc.wantLines {
				t.Errorf("String %q, Len %d, Lines %d; want %q, %d, %d", b.String(), b.Len(), b.Lines(), tc.want, len(tc.want), tc.wantLines)
			}

			d := NewDiscardLineBuffer()
			tc.write(d)
			if d.Bytes() != nil || d.Len() != 0 || d.Lines() != tc.wantLines {
				t.Errorf("discarding: Bytes %q, Len %d, Lines %d; want nil, 0, %d", d.Bytes(), d.Len(), d.Lines(), tc.wantLines)
			}

			b.Reset()
			if b.Len() != 0 || b.Lines() != 0 || b.String() != "" {
				t.Errorf("after Reset: %q, %d lines", b.String(), b.Lines())
			}
			b.Write("x")
			if b.String() != "x\n" {
				t.Errorf("after Reset and Write: %q", b.String())
			}
		})
	}
}

func TestLineBufferZeroValueAndGrow(t *testing.T) {
	var b LineBuffer
	b.Grow(100)
	if cap(b.Bytes()) < 100 {
		t.Errorf("Grow(100) left capacity %d", cap(b.Bytes()))
	}
	b.Write("a", "b")
	p := &b.Bytes()[0]
	b.Grow(10)
	b.Write("c")
	if &b.Bytes()[0] != p {
		t.Error("writing within grown capacity reallocated")
	}
	if b.String() != "a b\nc\n" {
		t.Errorf("got %q", b.String())
	}
}

func TestLineBufferDoesNotAllocate(t *testing.T) {
	b := NewLineBuffer()
	chain, ep := "KUBE-SEP-ABCDEFGHIJKLMNOP", "10.244.1.5:8080"
	write := func() {
		b.Reset()
		for i := 0; i < 100; i++ {
			b.Words("-A", chain, "-m", "comment", "--comment", `"ns/svc:http"`).Words("-m", "tcp", "-p", "tcp").
				Words("-j", "DNAT", "--to-destination", ep).EndLine()
		}
	}
	write()
	if n := testing.AllocsPerRun(10, write); n != 0 {
		t.Errorf("writing 100 lines into a grown buffer allocated %v times", n)
	}
}

// BenchmarkLineBuffer writes one typical kube-proxy DNAT rule per
// iteration, into a buffer reset every 10,000 lines as a sync would.
func BenchmarkLineBuffer(b *testing.B) {
	buf := NewLineBuffer()
	chain, ep := "KUBE-SEP-ABCDEFGHIJKLMNOP", "10.244.1.5:8080"
	args := []string{"-m", "tcp", "-p", "tcp", "-m", "recent", "--name", chain, "--set"}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if i%10000 == 0 {
			buf.Reset()
		}
		buf.Words("-A", chain, "-m", "comment", "--comment", `"ns/svc:http"`).Words(args...).
			Words("-j", "DNAT", "--to-destination", ep).EndLine()
	}
	b.SetBytes(int64(buf.Len() / max(buf.Lines(), 1)))
}
