//go:build !linux

package nftables

import (
	"errors"

	"sigs.k8s.io/knftables"
)

// netlinkTableLookup fails: there is no nf_tables netlink off Linux.
func netlinkTableLookup(knftables.Family, string) (TableLookup, func() error, error) {
	return nil, nil, errors.New("not supported on this operating system")
}
