package iptables

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestTablesAndChains(t *testing.T) {
	want := map[Table][]Chain{
		TableFilter:   {ChainInput, ChainForward, ChainOutput},
		TableNAT:      {ChainPrerouting, ChainInput, ChainOutput, ChainPostrouting},
		TableMangle:   {ChainPrerouting, ChainInput, ChainForward, ChainOutput, ChainPostrouting},
		TableRaw:      {ChainPrerouting, ChainOutput},
		TableSecurity: {ChainInput, ChainForward, ChainOutput},
	}
	for _, table := range Tables() {
		if diff := cmp.Diff(want[table], table.BuiltinChains()); diff != "" {
			t.Errorf("%s built-in chains (-want +got):\n%s", table, diff)
		}
		if !table.Valid() {
			t.Errorf("%s not valid", table)
		}
	}
	if len(Tables()) != len(want) {
		t.Errorf("Tables() = %v", Tables())
	}
	if Table("foo").Valid() || Table("foo").BuiltinChains() != nil {
		t.Error("table foo is valid")
	}
	for _, tc := range []struct {
		c    Chain
		t    Table
		want bool
	}{
		{ChainForward, TableFilter, true},
		{ChainForward, TableNAT, false},
		{ChainPrerouting, TableRaw, true},
		{"KUBE-SERVICES", TableNAT, false},
		{ChainInput, "foo", false},
	} {
		if got := tc.c.IsBuiltin(tc.t); got != tc.want {
			t.Errorf("%s.IsBuiltin(%s) = %v", tc.c, tc.t, got)
		}
	}
}
