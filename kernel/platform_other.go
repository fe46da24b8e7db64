//go:build !linux

package kernel

// hostIsLinux is false: the real root has no Linux /proc or /sys, and
// reading it returns ErrNotSupported.
const hostIsLinux = false
