package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/kubeproxy"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "explain" {
		ctx := klog.NewContext(context.Background(), klog.Background())
		code := explainMain(ctx, os.Args[2:], realEnvironment(os.Stdout), os.Stderr)
		klog.Flush()
		os.Exit(code)
	}
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

// environment is what the proxier takes from the machine it runs on: the
// Host kubeproxy works on, where a dry run prints, and the cluster. The
// real one is realEnvironment; tests replace parts of it.
type environment struct {
	*kubeproxy.Host
	// stdout receives a dry run's output.
	stdout io.Writer
	// client, when set, is used instead of --manifests or an API server.
	client kubernetes.Interface
}

func realEnvironment(stdout io.Writer) *environment {
	return &environment{Host: kubeproxy.RealHost(), stdout: stdout}
}
