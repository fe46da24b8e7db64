//go:build !linux

package iptables

import (
	"context"
	"io"
	"time"

	"k8s.io/utils/clock"
)

func grabXtablesLock(ctx context.Context, clk clock.Clock, path string, file bool, wait time.Duration) (io.Closer, error) {
	return nil, platformSupported()
}
