package ipvs_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/proxykit/proxykit/ipvs"
)

type failingChecker struct{ err error }

func (c failingChecker) CanUseIPVS(context.Context, ...string) error { return c.err }

func TestNewRefusesWhenThePrerequisiteCheckFails(t *testing.T) {
	missing := errors.New("missing IPVS modules ip_vs, ip_vs_rr")
	n, err := ipvs.New(context.Background(), ipvs.WithPrerequisites(failingChecker{missing}))
	if n != nil || !ipvs.IsNotSupported(err) || !errors.Is(err, missing) {
		t.Errorf("New = %v, %v; want an error wrapping ErrNotSupported and the checker's", n, err)
	}
}

// TestNewRefusesWithoutIPVS runs on a kernel without IPVS, such as the
// test machines' own: New must say so, whether the kernel package's check
// runs or only the netlink one.
func TestNewRefusesWithoutIPVS(t *testing.T) {
	if _, err := netlink.GenlFamilyGet("IPVS"); err == nil {
		t.Skip("this kernel has IPVS")
	}
	for _, tc := range []struct {
		name string
		opts []ipvs.Option
		want string
	}{
		{"kernel check", nil, "ip_vs"},
		{"netlink check", []ipvs.Option{ipvs.WithPrerequisites(nil)}, "no IPVS generic netlink family"},
	} {
		n, err := ipvs.New(context.Background(), tc.opts...)
		if n != nil || !ipvs.IsNotSupported(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v, %v; want ErrNotSupported mentioning %q", tc.name, n, err, tc.want)
		}
	}
}
