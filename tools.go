//go:build tools

// Package proxykit: this file pins the module's dependencies while the
// packages that use them are written; it is never built.
package proxykit

import (
	_ "github.com/fsnotify/fsnotify"
	_ "github.com/google/go-cmp/cmp"
	_ "github.com/moby/ipvs"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/vishvananda/netlink"
	_ "golang.org/x/sys/unix"
	_ "k8s.io/api/core/v1"
	_ "k8s.io/apimachinery/pkg/types"
	_ "k8s.io/client-go/informers"
	_ "k8s.io/client-go/kubernetes/fake"
	_ "k8s.io/klog/v2"
	_ "k8s.io/utils/clock/testing"
	_ "k8s.io/utils/exec/testing"
	_ "sigs.k8s.io/yaml"
)
