package main

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/kernel"
)

// errIPVSNotReady is the answer of --mode ipvs on a node that could run it.
var errIPVSNotReady = errors.New("--mode ipvs: this kernel has what IPVS mode needs, but this proxier does not run IPVS mode yet; use --mode iptables")

// refuseIPVS checks that the kernel can run IPVS mode, and refuses either
// way: with the kernel's reason when it cannot, and with errIPVSNotReady
// when it can. A dry run only looks at the kernel; otherwise missing
// modules are loaded with modprobe first, as kube-proxy does.
func refuseIPVS(ctx context.Context, o *options, env *environment) error {
	k := env.kernel
	if o.dryRun {
		k = &kernel.Kernel{Root: k.Root}
	}
	if err := k.CanUseIPVS(ctx); err != nil {
		return fmt.Errorf("--mode ipvs: %w", err)
	}
	return errIPVSNotReady
}

// cleanupRules removes what iptables mode made, in both IP families, from
// the backend this node uses. A family whose iptables is missing (no
// ip6tables, say) has nothing to clean.
func cleanupRules(ctx context.Context, env *environment) error {
	logger := klog.FromContext(ctx)
	b, err := env.detectBackend(ctx)
	if err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	var errs []error
	cleaned := 0
	for _, proto := range []iptables.Protocol{iptables.ProtocolIPv4, iptables.ProtocolIPv6} {
		ipt, err := env.newIPTables(ctx, proto, b)
		if err != nil {
			logger.Info("Nothing to clean up: no usable iptables for this family", "family", proto, "backend", b, "reason", err)
			continue
		}
		n, err := iptables.Cleanup(ctx, ipt)
		if err != nil {
			errs = append(errs, err)
		}
		cleaned++
		logger.Info("Removed the proxier's rules", "family", proto, "backend", b, "chains", n)
	}
	if cleaned == 0 {
		return fmt.Errorf("cleanup: no iptables of backend %s works here", b)
	}
	return errors.Join(errs...)
}
