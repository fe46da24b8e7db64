//go:build !linux

package iptables

// NewNFAcct fails with ErrNotSupported outside Linux.
func NewNFAcct(netns string) (NFAcct, error) { return nil, platformSupported() }
