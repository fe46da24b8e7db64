//go:build !linux

package nftables

// ApplyElementBatch sends b through nf_tables netlink, which exists on
// Linux only: here it fails unless b is empty.
func ApplyElementBatch(b ElementBatch) error {
	if b.Len() == 0 {
		return nil
	}
	return errUnsupported
}
