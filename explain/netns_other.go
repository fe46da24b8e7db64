//go:build !linux

package explain

import (
	"errors"
	"net/netip"

	v1 "k8s.io/api/core/v1"
)

var errNetNS = errors.New("network namespaces are only supported on Linux")

func inNetNS(path string, fn func() error) error {
	if path != "" {
		return errNetNS
	}
	return fn()
}

// NodeAddresses returns the addresses of family on the interfaces of the
// network namespace at netnsPath; on this system it always fails.
func NodeAddresses(netnsPath string, family v1.IPFamily) ([]netip.Addr, error) {
	return nil, errNetNS
}
