//go:build !linux

package iptables

// adviseHugePages does nothing where transparent huge pages cannot be
// asked for.
func adviseHugePages([]byte) {}
