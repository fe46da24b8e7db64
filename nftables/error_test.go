package nftables_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/nftables"
)

// fakeErrors returns the errors knftables.Fake gives for a chain deleted
// from a table that does not hold it (ENOENT, as nft says) and for a table
// created twice (EEXIST).
func fakeErrors(t *testing.T) (notFound, exists error) {
	t.Helper()
	ctx := context.Background()
	fake := knftables.NewFake(knftables.IPv4Family, "kube-proxy")
	tx := fake.NewTransaction()
	tx.Add(&knftables.Table{})
	if err := fake.Run(ctx, tx); err != nil {
		t.Fatal(err)
	}
	tx = fake.NewTransaction()
	tx.Delete(&knftables.Chain{Name: "missing"})
	notFound = fake.Run(ctx, tx)
	tx = fake.NewTransaction()
	tx.Create(&knftables.Table{})
	exists = fake.Run(ctx, tx)
	if notFound == nil || exists == nil {
		t.Fatalf("knftables.Fake gave %v, %v; want two errors", notFound, exists)
	}
	return notFound, exists
}

// TestErrorHelpers checks that IsNotFound and IsNotSupported each hold for
// their own errors, wrapped or not, and for no other.
func TestErrorHelpers(t *testing.T) {
	notFound, exists := fakeErrors(t)
	type verdict struct{ NotFound, NotSupported bool }
	for _, tc := range []struct {
		name string
		err  error
		want verdict
	}{
		{"nil", nil, verdict{}},
		{"ErrTableNotFound", nftables.ErrTableNotFound, verdict{NotFound: true}},
		{"KernelState's missing table", fmt.Errorf("table ip kube-proxy: %w", nftables.ErrTableNotFound), verdict{NotFound: true}},
		{"nft's missing chain", notFound, verdict{NotFound: true}},
		{"nft's missing chain, wrapped", fmt.Errorf("sync: %w", notFound), verdict{NotFound: true}},
		{"nft's existing table", exists, verdict{}},
		{"ErrNotSupported", nftables.ErrNotSupported, verdict{NotSupported: true}},
		{"wrapped with the platform", fmt.Errorf("%w on darwin", nftables.ErrNotSupported), verdict{NotSupported: true}},
		{"the same words, another error", errors.New("nftables table not found"), verdict{}},
		{"another package's not found", errors.New("iptables: not found"), verdict{}},
		{"another package's not supported", errors.New("iptables: not supported"), verdict{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := verdict{NotFound: nftables.IsNotFound(tc.err), NotSupported: nftables.IsNotSupported(tc.err)}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("IsNotFound, IsNotSupported of %v (-want +got):\n%s", tc.err, diff)
			}
		})
	}
}

// TestErrNotSupportedWording checks the wording every kernel-facing
// package shares: "<package>: not supported".
func TestErrNotSupportedWording(t *testing.T) {
	if diff := cmp.Diff("nftables: not supported", nftables.ErrNotSupported.Error()); diff != "" {
		t.Errorf("ErrNotSupported (-want +got):\n%s", diff)
	}
}
