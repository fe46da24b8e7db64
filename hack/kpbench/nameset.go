package main

import (
	"hash/maphash"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// offHeapMap is a map of strings kept outside the Go heap, in anonymous
// mappings, so that the stand-in kernel's model of the table (a hundred
// thousand chain names at 10k×10 for kube-proxy, and its maps' elements)
// does not count in the peak heap of the proxy whose process it sits in.
// It is an open-addressing hash table of (offset, lengths) into an
// append-only slab of key and value bytes.
type offHeapMap struct {
	slab []byte
	used int
	mem  []byte // the slots' mapping
	// slots holds two words per slot: offset+1 of the key in slab (0:
	// empty; tombstone), and key length<<32 | value length.
	slots []uint64
	n     int // live entries
	dead  int // tombstones
	seed  maphash.Seed
}

const (
	tombstone = ^uint64(0)
	slabSize  = 4 << 30 // reserved, not touched: MAP_NORESERVE
	minSlots  = 1 << 8
)

func newOffHeapMap() *offHeapMap {
	slab, err := unix.Mmap(-1, 0, slabSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		panic(err)
	}
	m := &offHeapMap{slab: slab, seed: maphash.MakeSeed()}
	m.resize(minSlots)
	return m
}

func (m *offHeapMap) cap() int { return len(m.slots) / 2 }

func (m *offHeapMap) resize(n int) {
	mem, err := unix.Mmap(-1, 0, n*16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		panic(err)
	}
	old, oldMem := m.slots, m.mem
	m.mem, m.slots = mem, unsafe.Slice((*uint64)(unsafe.Pointer(&mem[0])), 2*n)
	m.n, m.dead = 0, 0
	for i := 0; i < len(old); i += 2 {
		if old[i] != 0 && old[i] != tombstone {
			_, free := m.find(m.key(old[i], old[i+1]))
			m.slots[2*free], m.slots[2*free+1] = old[i], old[i+1]
			m.n++
		}
	}
	if oldMem != nil {
		_ = unix.Munmap(oldMem)
	}
}

func (m *offHeapMap) key(off, lens uint64) string {
	return unsafe.String(&m.slab[off-1], int(lens>>32))
}

func (m *offHeapMap) value(off, lens uint64) string {
	kl, vl := int(lens>>32), int(lens&(1<<32-1))
	if vl == 0 {
		return ""
	}
	return unsafe.String(&m.slab[int(off)-1+kl], vl)
}

// find returns the slot holding key, or -1 and the first free slot.
func (m *offHeapMap) find(key string) (at, free int) {
	mask := m.cap() - 1
	free = -1
	for i := int(maphash.String(m.seed, key)) & mask; ; i = (i + 1) & mask {
		switch off := m.slots[2*i]; {
		case off == 0:
			if free < 0 {
				free = i
			}
			return -1, free
		case off == tombstone:
			if free < 0 {
				free = i
			}
		case m.key(off, m.slots[2*i+1]) == key:
			return i, -1
		}
	}
}

// set makes key map to value.
func (m *offHeapMap) set(key, value string) {
	if at, _ := m.find(key); at >= 0 {
		if m.value(m.slots[2*at], m.slots[2*at+1]) == value {
			return
		}
		m.remove(key)
	}
	if (m.n+m.dead+1)*2 > m.cap() {
		n := m.cap()
		if (m.n+1)*4 > n {
			n *= 2
		}
		m.resize(n)
	}
	if m.used+len(key)+len(value) > len(m.slab) {
		panic("offHeapMap: slab full")
	}
	off := m.used
	m.used += copy(m.slab[off:], key)
	m.used += copy(m.slab[m.used:], value)
	_, free := m.find(key)
	if m.slots[2*free] == tombstone {
		m.dead--
	}
	m.slots[2*free], m.slots[2*free+1] = uint64(off+1), uint64(len(key))<<32|uint64(len(value))
	m.n++
}

func (m *offHeapMap) remove(key string) {
	if at, _ := m.find(key); at >= 0 {
		m.slots[2*at] = tombstone
		m.n--
		m.dead++
	}
}

func (m *offHeapMap) clear() {
	m.slots, m.used = nil, 0
	m.resize(minSlots)
}

// each calls f with every key and value, in no order. The strings point
// into the map: f copies what it keeps.
func (m *offHeapMap) each(f func(key, value string)) {
	for i := 0; i < len(m.slots); i += 2 {
		if off := m.slots[i]; off != 0 && off != tombstone {
			f(m.key(off, m.slots[i+1]), m.value(off, m.slots[i+1]))
		}
	}
}

// keys returns the keys as new strings on the Go heap, as a real listing's
// are.
func (m *offHeapMap) keys() []string {
	out := make([]string, 0, m.n)
	m.each(func(k, _ string) { out = append(out, strings.Clone(k)) })
	return out
}
