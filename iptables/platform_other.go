//go:build !linux

package iptables

import (
	"fmt"
	"runtime"
)

func platformSupported() error {
	return fmt.Errorf("%w, not on %s", ErrNotSupported, runtime.GOOS)
}
