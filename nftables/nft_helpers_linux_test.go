package nftables_test

import (
	"testing"

	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/kerneltest"
	"github.com/proxykit/proxykit/nftables"
)

// nsNFT returns an Interface for the family's table of the writer's
// default name in ns, made inside ns (knftables.New checks nft there). Its
// transactions reach ns only when Run is called from inside ns.Do.
func nsNFT(t testing.TB, ns *kerneltest.NS, family knftables.Family) knftables.Interface {
	t.Helper()
	var nft knftables.Interface
	if err := ns.Do(func() (err error) {
		nft, err = knftables.New(family, nftables.DefaultTableName)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return nft
}
