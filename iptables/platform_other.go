//go:build !linux

package iptables

import (
	"fmt"
	"runtime"
)

func platformSupported() error {
	return fmt.Errorf("%w on %s", ErrNotSupported, runtime.GOOS)
}
