//go:build !linux

package iptables

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

func grabXtablesLock(ctx context.Context, clk clock.Clock, path string, file bool, wait time.Duration) (func(), error) {
	return nil, platformSupported()
}
