//go:build !linux

package kernel

// hostIsLinux is false: the real root has no Linux /proc or /sys, and
// reading it returns an error wrapping ErrNotSupported.
const hostIsLinux = false
