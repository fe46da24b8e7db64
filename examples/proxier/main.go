package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/healthz"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/ipvsmode"
	"github.com/proxykit/proxykit/kernel"
	"github.com/proxykit/proxykit/nftables"
	"github.com/proxykit/proxykit/proxier"
	"github.com/proxykit/proxykit/proxier/nftablesbackend"
)

func main() {
	o, err := parseOptions(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxier:", err)
		os.Exit(2)
	}
	// SIGTERM and SIGINT stop the proxier and leave its rules in place, as
	// kube-proxy does: a restarted proxier, or the next one, takes over
	// without a gap in service.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	warnUnsupported(klog.FromContext(ctx), o)
	warnIgnoredFlags(klog.FromContext(ctx), o)
	if err := run(ctx, o, realEnvironment(os.Stdout)); err != nil {
		klog.FromContext(ctx).Error(err, "Proxier failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

// environment is what the proxier takes from the machine it runs on. The
// real one is realEnvironment; tests replace parts of it.
type environment struct {
	// stdout receives a dry run's output.
	stdout io.Writer
	// client, when set, is used instead of --manifests or an API server.
	client kubernetes.Interface
	// detectBackend picks the iptables backend; newIPTables makes the
	// Interface of one family for it.
	detectBackend func(ctx context.Context) (iptables.Backend, error)
	newIPTables   func(ctx context.Context, p v1.IPFamily, b iptables.Backend) (iptables.Interface, error)
	conntrack     conntrack.Interface
	kernel        *kernel.Kernel
	// openIPVS opens IPVS mode's kernel side, with the IPVS table when
	// table is set (see ipvsmode.OpenHandles).
	openIPVS func(ctx context.Context, table bool) (*ipvsmode.Handles, error)
	// newNFTables makes the knftables Interface of nftables mode's table
	// of one family.
	newNFTables func(ctx context.Context, family knftables.Family, table string) (knftables.Interface, error)
	// nftTableLookup, when set, is how nftables mode checks that its
	// table of one family still exists, instead of asking the kernel
	// over netlink.
	nftTableLookup func(family knftables.Family, table string) nftablesbackend.TableLookup
	// nftApplyElements, when set, sends the elements of nftables mode's
	// first load into a missing table through netlink (the real kernel
	// only: nil where newNFTables makes fakes).
	nftApplyElements func([]*knftables.Element) error
	// nftApplyBatch, when set, sends nftables mode's partial syncs that
	// change only elements as one netlink batch (the real kernel only,
	// like nftApplyElements).
	nftApplyBatch func(nftables.ElementBatch) error
	// hostAddresses lists the node's addresses when no Node object gives
	// them.
	hostAddresses func() ([]netip.Addr, error)
	// listen opens the listeners of the health, health-check and metrics
	// servers.
	listen healthz.ListenFunc
}

func realEnvironment(stdout io.Writer) *environment {
	// XTABLES_LOCKFILE is how iptables itself is told to use another lock
	// (a program working in a network namespace of its own need not wait
	// for the host's); honour it for the lock the Interface takes too.
	lockFile := os.Getenv("XTABLES_LOCKFILE")
	return &environment{
		stdout: stdout,
		detectBackend: func(ctx context.Context) (iptables.Backend, error) {
			return iptables.DetectBackend(ctx, nil)
		},
		newIPTables: func(ctx context.Context, p v1.IPFamily, b iptables.Backend) (iptables.Interface, error) {
			return iptables.New(ctx, p, iptables.WithBackend(b), iptables.WithLockFile(lockFile))
		},
		conntrack: conntrack.New(),
		kernel:    kernel.New(),
		openIPVS:  ipvsmode.OpenHandles,
		newNFTables: func(_ context.Context, family knftables.Family, table string) (knftables.Interface, error) {
			return knftables.New(family, table)
		},
		nftApplyElements: nftables.ApplyElements,
		nftApplyBatch:    nftables.ApplyElementBatch,
		hostAddresses:    proxier.HostAddresses,
		listen: func(ctx context.Context, network, address string) (net.Listener, error) {
			var lc net.ListenConfig
			return lc.Listen(ctx, network, address)
		},
	}
}
