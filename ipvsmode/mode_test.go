package ipvsmode_test

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/iptables/iptablestest"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/proxy"
	"github.com/proxykit/proxykit/proxy/proxytest"
)

func translatorConfig(family v1.IPFamily, prefix string) ipvsmode.WriterConfig {
	return ipvsmode.WriterConfig{Family: family, Node: proxy.NodeConfig{Name: "node-a"}, ChainPrefix: prefix}
}

// TestNewRefuses checks the configurations NewMode refuses.
func TestNewRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfgs []ipvsmode.WriterConfig
		ipts []iptables.Interface
		want string
	}{
		{"an iptables short", []ipvsmode.WriterConfig{translatorConfig(v1.IPv4Protocol, "KUBE"), translatorConfig(v1.IPv6Protocol, "KUBE")},
			[]iptables.Interface{iptablestest.NewFake()}, "1 iptables for 2 families"},
		{"prefixes differ", []ipvsmode.WriterConfig{translatorConfig(v1.IPv4Protocol, "KUBE"), translatorConfig(v1.IPv6Protocol, "OTHER")},
			nil, "chain prefixes"},
		{"no family", []ipvsmode.WriterConfig{{Node: proxy.NodeConfig{Name: "node-a"}}}, nil, "IPVS translator"},
	} {
		if _, err := ipvsmode.NewMode(context.Background(), tc.cfgs, nil, tc.ipts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: NewMode returned %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}

// TestSyncRefusesOtherInputs checks that a Mode fails a sync whose
// inputs are not one per family, in its order, and that in a dry run it
// prints each family's translation.
func TestSyncRefusesOtherInputs(t *testing.T) {
	ctx := context.Background()
	var out strings.Builder
	b, err := ipvsmode.NewMode(context.Background(), []ipvsmode.WriterConfig{translatorConfig(v1.IPv4Protocol, "KUBE"), translatorConfig(v1.IPv6Protocol, "KUBE")}, nil, nil, ipvsmode.WithDryRun(&out))
	if err != nil {
		t.Fatal(err)
	}
	v4, v6 := proxytest.Input(v1.IPv4Protocol), proxytest.Input(v1.IPv6Protocol)
	proxytest.SyncRefuses(ctx, t, b, [][]*proxy.FamilyInput{{v4}, {v6, v4}, {v4, v4}})
	if out.Len() != 0 {
		t.Errorf("refused syncs printed %q", out.String())
	}
	outs, err := b.Sync(ctx, []*proxy.FamilyInput{v4, v6})
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != 2 || !outs[0].Full || !outs[1].Full {
		t.Errorf("results %+v, want two full ones", outs)
	}
	if out.Len() == 0 {
		t.Error("the dry run printed nothing")
	}
	if err := b.Close(); err != nil {
		t.Errorf("Close of a dry run: %v", err)
	}
}
