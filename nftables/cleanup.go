package nftables

import (
	"context"
	"errors"
	"fmt"

	"sigs.k8s.io/knftables"
)

// Cleanup deletes the table named table (DefaultTableName if "") in both
// families, "ip" and "ip6", with everything in it, as --cleanup does. A
// table that does not exist is not an error. newInterface makes the
// Interface for a family and table; nil means knftables.New. Both
// families are tried even if one fails; the error names each failure.
func Cleanup(ctx context.Context, table string, newInterface func(knftables.Family, string) (knftables.Interface, error)) error {
	if table == "" {
		table = DefaultTableName
	}
	if !isTableName(table) {
		return fmt.Errorf("nftables cleanup: table name %q is not 1 to 64 letters, digits, '-' or '_' starting with a letter", table)
	}
	if newInterface == nil {
		newInterface = func(f knftables.Family, t string) (knftables.Interface, error) { return knftables.New(f, t) }
	}
	var errs []error
	for _, family := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		nft, err := newInterface(family, table)
		if err == nil {
			tx := nft.NewTransaction()
			tx.Delete(&knftables.Table{Family: family, Name: table})
			err = nft.Run(ctx, tx)
		}
		if err != nil && !knftables.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("nftables cleanup: deleting table %s %s: %w", family, table, err))
		}
	}
	return errors.Join(errs...)
}
