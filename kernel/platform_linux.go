package kernel

// hostIsLinux is true where the real root holds a Linux /proc and /sys.
const hostIsLinux = true
