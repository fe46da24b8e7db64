package conntracktest

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/conntrack"
)

func udp(client, frontend, backend string) conntrack.Flow {
	return NewFlow(conntrack.ProtocolUDP, netip.MustParseAddrPort(client), netip.MustParseAddrPort(frontend), netip.MustParseAddrPort(backend))
}

func TestFakeAddFlows(t *testing.T) {
	a := udp("10.0.0.2:40001", "10.96.0.10:53", "10.0.1.2:5353")
	for _, tc := range []struct {
		name    string
		flows   []conntrack.Flow
		wantErr bool
	}{
		{"distinct flows", []conntrack.Flow{a, udp("10.0.0.2:40002", "10.96.0.10:53", "10.0.1.2:5353")}, false},
		{"same original tuple", []conntrack.Flow{a, udp("10.0.0.2:40001", "10.96.0.10:53", "10.0.2.2:5353")}, true},
		{"same reply tuple", []conntrack.Flow{a, udp("10.0.0.2:40001", "10.96.0.11:53", "10.0.1.2:5353")}, true},
		{"same tuples in another protocol", []conntrack.Flow{a, NewFlow(conntrack.ProtocolTCP, netip.MustParseAddrPort("10.0.0.2:40001"), netip.MustParseAddrPort("10.96.0.10:53"), netip.MustParseAddrPort("10.0.1.2:5353"))}, false},
		{"same tuples in another zone", []conntrack.Flow{a, func() conntrack.Flow { f := a; f.Zone = 7; return f }()}, false},
		{"mixed families", []conntrack.Flow{udp("10.0.0.2:40001", "[fd00::10]:53", "[fd00::2]:5353")}, true},
		{"invalid address", []conntrack.Flow{{Protocol: conntrack.ProtocolUDP}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := NewFake()
			err := f.AddFlows(tc.flows...)
			if (err != nil) != tc.wantErr {
				t.Fatalf("AddFlows error = %v, want error %v", err, tc.wantErr)
			}
			want := len(tc.flows)
			if tc.wantErr {
				want = 0 // all or nothing
			}
			if got := len(f.Flows()); got != want {
				t.Errorf("%d flows in the table, want %d", got, want)
			}
		})
	}
}

func TestFakeListDelete(t *testing.T) {
	ctx := context.Background()
	v4a := udp("10.0.0.2:40001", "10.96.0.10:53", "10.0.1.2:5353")
	v4b := udp("10.0.0.2:40002", "10.96.0.10:53", "10.0.2.2:5353")
	v6 := udp("[fd00::2]:40001", "[fd00:96::10]:53", "[fd00:1::2]:5353")
	f := NewFake()
	if err := f.AddFlows(v4a, v6, v4b); err != nil {
		t.Fatal(err)
	}

	got, err := f.ListFlows(ctx, v1.IPv6Protocol)
	if err != nil || len(got) != 1 || got[0].String() != v6.String() {
		t.Errorf("ListFlows(IPv6) = %v, %v", got, err)
	}
	if _, err := f.ListFlows(ctx, ""); err == nil {
		t.Error("ListFlows with no family did not fail")
	}

	// The same flow written with IPv4-mapped addresses matches; a flow of
	// the other family never does; one not in the table is skipped.
	mapped := v4a
	mapped.Original.Src = netip.AddrFrom16(v4a.Original.Src.As16())
	n, err := f.DeleteFlows(ctx, v1.IPv4Protocol, []conntrack.Flow{mapped, v6, udp("10.0.0.9:1", "10.96.0.10:53", "10.0.1.2:5353")})
	if err != nil || n != 1 {
		t.Fatalf("DeleteFlows = %d, %v; want 1", n, err)
	}
	want := "udp src=10.0.0.2 dst=10.96.0.10 sport=40002 dport=53 src=10.0.2.2 dst=10.0.0.2 sport=5353 dport=40002\n" +
		"udp src=fd00::2 dst=fd00:96::10 sport=40001 dport=53 src=fd00:1::2 dst=fd00::2 sport=5353 dport=40001\n"
	if diff := cmp.Diff(want, f.Dump()); diff != "" {
		t.Errorf("Dump (-want +got):\n%s", diff)
	}
	if len(f.Deleted) != 1 || f.Deleted[0].String() != v4a.String() {
		t.Errorf("Deleted = %v", f.Deleted)
	}

	f.DeleteError = errors.New("boom")
	if n, err := f.DeleteFlows(ctx, v1.IPv4Protocol, []conntrack.Flow{v4b}); err == nil || n != 0 || len(f.Flows()) != 2 {
		t.Errorf("DeleteFlows with DeleteError = %d, %v; table %v", n, err, f.Flows())
	}
	f.ListError = errors.New("boom")
	if _, err := f.ListFlows(ctx, v1.IPv4Protocol); err == nil {
		t.Error("ListFlows with ListError did not fail")
	}
	if f.ListCalls != 3 || f.DeleteCalls != 2 {
		t.Errorf("ListCalls=%d DeleteCalls=%d, want 3 and 2", f.ListCalls, f.DeleteCalls)
	}
}

func TestFlowString(t *testing.T) {
	f := udp("10.0.0.2:40001", "10.96.0.10:53", "10.96.0.10:53")
	f.Zone = 3
	want := "udp src=10.0.0.2 dst=10.96.0.10 sport=40001 dport=53 src=10.96.0.10 dst=10.0.0.2 sport=53 dport=40001 zone=3"
	if f.String() != want {
		t.Errorf("String() =\n%s\nwant\n%s", f.String(), want)
	}
	if got := conntrack.Protocol(47).String(); got != "47" {
		t.Errorf("Protocol(47) = %q", got)
	}
}
