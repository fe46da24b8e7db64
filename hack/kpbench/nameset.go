package main

import (
	"hash/maphash"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// nameSet is a set of strings kept outside the Go heap, in anonymous
// mappings, so that the stand-in kernel's list of chains (a hundred
// thousand names at 10k×10 for kube-proxy) does not count in the peak heap
// of the proxy whose process it sits in. It is an open-addressing hash
// table of (offset, length) into an append-only slab of name bytes.
type nameSet struct {
	slab  []byte
	used  int
	mem   []byte   // slots' mapping
	slots []uint64 // 0: empty; tombstone; else (offset+1)<<24 | length
	n     int      // live names
	dead  int      // tombstones
	seed  maphash.Seed
}

const (
	tombstone = 1
	slabSize  = 4 << 30 // reserved, not touched: MAP_NORESERVE
	minSlots  = 1 << 10
)

func newNameSet() *nameSet {
	slab, err := unix.Mmap(-1, 0, slabSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		panic(err)
	}
	s := &nameSet{slab: slab, seed: maphash.MakeSeed()}
	s.resize(minSlots)
	return s
}

func (s *nameSet) resize(n int) {
	mem, err := unix.Mmap(-1, 0, n*8, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		panic(err)
	}
	old, oldMem := s.slots, s.mem
	s.mem, s.slots = mem, unsafe.Slice((*uint64)(unsafe.Pointer(&mem[0])), n)
	s.n, s.dead = 0, 0
	for _, e := range old {
		if e > tombstone {
			s.insert(e)
		}
	}
	if oldMem != nil {
		_ = unix.Munmap(oldMem)
	}
}

func (s *nameSet) name(e uint64) string {
	off := int(e>>24) - 1
	return unsafe.String(&s.slab[off], int(e&(1<<24-1)))
}

// find returns the slot holding name, or -1 and the first free slot.
func (s *nameSet) find(name string) (at, free int) {
	mask := len(s.slots) - 1
	free = -1
	for i := int(maphash.String(s.seed, name)) & mask; ; i = (i + 1) & mask {
		switch e := s.slots[i]; {
		case e == 0:
			if free < 0 {
				free = i
			}
			return -1, free
		case e == tombstone:
			if free < 0 {
				free = i
			}
		case s.name(e) == name:
			return i, -1
		}
	}
}

func (s *nameSet) insert(e uint64) {
	_, free := s.find(s.name(e))
	if s.slots[free] == tombstone {
		s.dead--
	}
	s.slots[free] = e
	s.n++
}

func (s *nameSet) add(name string) {
	if name == "" || len(name) >= 1<<24 {
		return
	}
	if at, _ := s.find(name); at >= 0 {
		return
	}
	if (s.n+s.dead+1)*2 > len(s.slots) {
		n := len(s.slots)
		if (s.n+1)*4 > n {
			n *= 2
		}
		s.resize(n)
	}
	if s.used+len(name) > len(s.slab) {
		panic("nameSet: slab full")
	}
	copy(s.slab[s.used:], name)
	e := uint64(s.used+1)<<24 | uint64(len(name))
	s.used += len(name)
	s.insert(e)
}

func (s *nameSet) remove(name string) {
	if at, _ := s.find(name); at >= 0 {
		s.slots[at] = tombstone
		s.n--
		s.dead++
	}
}

func (s *nameSet) clear() {
	s.slots, s.used = nil, 0
	s.resize(minSlots)
}

// list returns the names, in no order, as new strings on the Go heap (as
// the real List's are).
func (s *nameSet) list() []string {
	out := make([]string, 0, s.n)
	for _, e := range s.slots {
		if e > tombstone {
			out = append(out, strings.Clone(s.name(e)))
		}
	}
	return out
}
