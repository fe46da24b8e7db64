package iptables

import (
	"bytes"
	"testing"
)

// TestAdviseHugePages checks that the advice, which covers only the whole
// 2 MiB pages inside a buffer's capacity, takes buffers of any size and
// offset and leaves their bytes and bounds as they were.
func TestAdviseHugePages(t *testing.T) {
	for _, size := range []int{0, 1, 4 << 20, 4<<20 + 1, 9<<20 + 123} {
		for _, off := range []int{0, 1, 4097} {
			buf := make([]byte, off+size)
			for i := range buf {
				buf[i] = byte(i)
			}
			b := buf[off:]
			want := bytes.Clone(b)
			adviseHugePages(b)
			if !bytes.Equal(b, want) || len(b) != size {
				t.Errorf("size %d, offset %d: the advice changed the buffer", size, off)
			}
		}
	}
}
