//go:build !linux

package nftables

import (
	"errors"

	"sigs.k8s.io/knftables"
)

// ApplyElements sends elements through nf_tables netlink, which exists on
// Linux only: here it fails unless there are none.
func ApplyElements(elements []*knftables.Element) error {
	if len(elements) == 0 {
		return nil
	}
	return errors.New("nftables netlink: not supported on this platform")
}

// ApplyElementBatch sends b through nf_tables netlink, which exists on
// Linux only: here it fails unless b is empty.
func ApplyElementBatch(b ElementBatch) error {
	if b.Len() == 0 {
		return nil
	}
	return errors.New("nftables netlink: not supported on this platform")
}
