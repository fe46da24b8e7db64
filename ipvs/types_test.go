package ipvs_test

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ipvs"
)

var (
	vip  = netip.MustParseAddr("10.96.0.1")
	vip6 = netip.MustParseAddr("fd00:96::1")
	ep1  = netip.MustParseAddr("10.244.1.1")
	ep2  = netip.MustParseAddr("10.244.2.1")
	ep6  = netip.MustParseAddr("fd00:244::1")
	tcp  = v1.ProtocolTCP
	udp  = v1.ProtocolUDP
)

func TestVirtualServerValidate(t *testing.T) {
	for _, tc := range []struct {
		vs ipvs.VirtualServer
		ok bool
	}{
		{ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80}, true},
		{ipvs.VirtualServer{Address: vip6, Protocol: v1.ProtocolSCTP, Port: 0, Scheduler: "mh", Flags: ipvs.FlagSched1 | ipvs.FlagSched2}, true},
		{ipvs.VirtualServer{Address: vip, Protocol: udp, Port: 53, Flags: ipvs.FlagPersistent, Timeout: 10800}, true},
		{ipvs.VirtualServer{Protocol: tcp, Port: 80}, false},
		{ipvs.VirtualServer{Address: netip.MustParseAddr("::ffff:10.96.0.1"), Protocol: tcp, Port: 80}, false},
		{ipvs.VirtualServer{Address: netip.MustParseAddr("fe80::1%eth0"), Protocol: tcp, Port: 80}, false},
		{ipvs.VirtualServer{Address: vip, Protocol: "tcp", Port: 80}, false},
		{ipvs.VirtualServer{Address: vip, Protocol: "ICMP", Port: 80}, false},
		{ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80, Scheduler: "fastest"}, false},
		{ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80, Flags: 0x100}, false},
		{ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80, Flags: ipvs.FlagPersistent}, false},
	} {
		err := tc.vs.Validate()
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ipvs.ErrInvalid)) {
			t.Errorf("Validate(%+v) = %v, want ok=%v", tc.vs, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), tc.vs.String()) {
			t.Errorf("error %q does not name %s", err, tc.vs)
		}
	}
}

func TestRealServerValidate(t *testing.T) {
	vs := ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80}
	for _, tc := range []struct {
		rs ipvs.RealServer
		ok bool
	}{
		{ipvs.RealServer{Address: ep1, Port: 8080, Weight: 1}, true},
		{ipvs.RealServer{Address: ep1, Port: 8080, Weight: 0}, true},
		{ipvs.RealServer{Address: ep1, Port: 8080, Weight: -1}, false},
		{ipvs.RealServer{Address: ep1, Port: 8080, Weight: 1 << 31}, false},
		{ipvs.RealServer{Address: ep6, Port: 8080, Weight: 1}, false},
		{ipvs.RealServer{Port: 8080, Weight: 1}, false},
	} {
		err := tc.rs.Validate(vs)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ipvs.ErrInvalid)) {
			t.Errorf("Validate(%+v) = %v, want ok=%v", tc.rs, err, tc.ok)
		}
	}
}

func TestStringsAndEquality(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80}.String(), "10.96.0.1:80/TCP"},
		{ipvs.VirtualServer{Address: vip6, Protocol: udp, Port: 53}.String(), "[fd00:96::1]:53/UDP"},
		{ipvs.RealServer{Address: ep1, Port: 8080}.String(), "10.244.1.1:8080"},
		{ipvs.RealServer{Address: ep6, Port: 8080}.String(), "[fd00:244::1]:8080"},
		{ipvs.Timeouts{TCP: 900 * time.Second, TCPFin: 2 * time.Minute, UDP: 5 * time.Minute}.String(), "tcp 900 tcpfin 120 udp 300"},
		{ipvs.AddRealServer.String(), "add real server"},
		{ipvs.OpKind(99).String(), "OpKind(99)"},
		{ipvs.Op{Kind: ipvs.AddRealServer, VirtualServer: ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80}, RealServer: ipvs.RealServer{Address: ep1, Port: 8080}}.String(),
			"add real server 10.244.1.1:8080 to 10.96.0.1:80/TCP"},
		{ipvs.Op{Kind: ipvs.DeleteVirtualServer, VirtualServer: ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80}}.String(),
			"delete virtual server 10.96.0.1:80/TCP"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	base := ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80}
	for _, tc := range []struct {
		a, b        ipvs.VirtualServer
		equal, same bool
	}{
		{base, ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80, Scheduler: "rr"}, true, true},
		{base, ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80, Timeout: 30}, true, true},
		{base, ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80, Scheduler: "wrr"}, false, true},
		{base, ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80, Flags: ipvs.FlagPersistent, Timeout: 30}, false, true},
		{base, ipvs.VirtualServer{Address: vip, Protocol: udp, Port: 80}, false, false},
	} {
		if got := tc.a.Equal(tc.b); got != tc.equal {
			t.Errorf("%+v.Equal(%+v) = %v", tc.a, tc.b, got)
		}
		if got := tc.a.SameAs(tc.b); got != tc.same {
			t.Errorf("%+v.SameAs(%+v) = %v", tc.a, tc.b, got)
		}
	}
}

func TestBatchError(t *testing.T) {
	op := ipvs.Op{Kind: ipvs.DeleteVirtualServer, VirtualServer: ipvs.VirtualServer{Address: vip, Protocol: tcp, Port: 80}}
	e := &ipvs.BatchError{Failed: []ipvs.OpError{
		{Index: 1, Op: op, Err: fmt.Errorf("%s: %w", op, ipvs.ErrNotFound)},
		{Index: 3, Op: op, Err: fmt.Errorf("%s: %w", op, ipvs.ErrAlreadyExists)},
	}}
	if got, want := e.Error(), "delete virtual server 10.96.0.1:80/TCP: not found (and 1 more failed ops)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !ipvs.IsNotFound(e) || !ipvs.IsAlreadyExists(e) || errors.Is(e, ipvs.ErrInvalid) {
		t.Errorf("errors.Is does not see exactly the kinds of the failed ops")
	}
}
