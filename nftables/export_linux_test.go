package nftables

import (
	"time"

	"github.com/mdlayher/netlink"
)

// ApplyElementBatchWith is ApplyElementBatch bounded by timeout, with opt
// applied to its socket after the package's own options.
func ApplyElementBatchWith(b ElementBatch, timeout time.Duration, opt func(*netlink.Conn) error) error {
	return applyElementBatch(b, timeout, opt)
}
