package nftables

import (
	"maps"
	"slices"
)

// NetlinkSetNames are the sets and maps whose elements ApplyElementBatch
// sends, sorted: the kernel tests cover each.
var NetlinkSetNames = slices.Sorted(maps.Keys(netlinkSets))
