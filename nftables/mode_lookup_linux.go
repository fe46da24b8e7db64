package nftables

import (
	"context"
	"errors"
	"fmt"
	"os"

	gnft "github.com/google/nftables"
	"sigs.k8s.io/knftables"
)

// netlinkTableLookup returns a TableLookup that asks the kernel for the one
// table, by name, over a netlink socket opened now in the calling thread's
// network namespace: one request and one reply of a few dozen bytes,
// whatever the table holds (no nft process, and none of the listing of
// the table that nft would do; see BenchmarkTableCheck). The second
// function closes the socket.
func netlinkTableLookup(family knftables.Family, table string) (TableLookup, func() error, error) {
	var fam gnft.TableFamily
	switch family {
	case knftables.IPv4Family:
		fam = gnft.TableFamilyIPv4
	case knftables.IPv6Family:
		fam = gnft.TableFamilyIPv6
	default:
		return nil, nil, fmt.Errorf("nft family %q", family)
	}
	conn, err := gnft.New(gnft.AsLasting())
	if err != nil {
		return nil, nil, err
	}
	lookup := func(ctx context.Context) (bool, error) {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		_, err := conn.ListTableOfFamily(table, fam)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, os.ErrNotExist):
			return false, nil
		}
		return false, fmt.Errorf("looking up table %s %s: %w", family, table, err)
	}
	return lookup, conn.CloseLasting, nil
}
