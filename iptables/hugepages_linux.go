package iptables

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// adviseHugePages asks the kernel to back the whole 2 MiB pages inside b's
// capacity with transparent huge pages, where the system allows them on
// request (transparent_hugepage set to "madvise" or "always"). A fresh
// payload buffer is tens of megabytes that the first full sync writes
// once from start to end; with 4 KiB pages each of them costs a page
// fault, which in a virtual machine is a large part of that sync. The
// advice is only a hint: refused or ignored, nothing changes but the
// faults.
func adviseHugePages(b []byte) {
	const huge = 2 << 20
	b = b[:cap(b)]
	if len(b) < 2*huge {
		return
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	start := (base + huge - 1) &^ (huge - 1)
	end := (base + uintptr(len(b))) &^ (huge - 1)
	if end <= start {
		return
	}
	_ = unix.Madvise(b[start-base:end-base], unix.MADV_HUGEPAGE)
}
