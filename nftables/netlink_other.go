//go:build !linux

package nftables

import "time"

// ApplyElementBatch sends b through nf_tables netlink, which exists on
// Linux only: here it fails unless b is empty, with an error wrapping
// [ErrNotSupported].
func ApplyElementBatch(b ElementBatch) error {
	return applyElementBatch(b, 0)
}

func applyElementBatch(b ElementBatch, _ time.Duration) error {
	if b.Len() == 0 {
		return nil
	}
	return errUnsupported
}
