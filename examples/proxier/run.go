package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/examples/proxier/manifests"
	"github.com/proxykit/proxykit/healthz"
	"github.com/proxykit/proxykit/kubeproxy"
	"github.com/proxykit/proxykit/proxier"
)

// manifestSettle folds the several writes of one edit of a manifest file
// into one reload.
const manifestSettle = 100 * time.Millisecond

// run is the proxier. It returns when ctx is done, or after the first sync
// with --dry-run and --once.
func run(ctx context.Context, o *options, env *environment) error {
	if o.writeConfigTo != "" {
		return writeConfigFile(o)
	}
	cfg := o.kubeProxyConfig()
	if o.cleanup {
		return kubeproxy.Cleanup(ctx, cfg, kubeproxy.WithHost(env.Host))
	}
	if o.initOnly {
		if err := kubeproxy.InitNode(ctx, cfg, kubeproxy.WithHost(env.Host)); err != nil {
			return err
		}
		klog.FromContext(ctx).Info("Node set up and --init-only given: exiting", "mode", o.mode)
		return nil
	}
	longRunning := !o.dryRun && !o.once
	nodeName, err := o.nodeName()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The proxier's metrics, with the process and Go runtime ones, in a
	// registry of their own. client-go's go there before the client is
	// built, so that the transport it makes is counted, as kube-proxy
	// counts it; the proxier finds them there.
	reg := prometheus.NewRegistry()
	// All of runtime/metrics, as kube-proxy's registry has them.
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsAll)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := proxier.RegisterClientMetrics(reg); err != nil && !errors.Is(err, proxier.ErrClientMetricsHooksTaken) {
		return err
	}
	client, err := openCluster(ctx, o, env, longRunning)
	if err != nil {
		return err
	}
	opts := []kubeproxy.Option{kubeproxy.WithHost(env.Host), kubeproxy.WithProxierOptions(proxier.WithMetricsRegisterer(reg))}
	if o.dryRun {
		opts = append(opts, kubeproxy.WithDryRun(env.stdout))
	}
	p, err := kubeproxy.New(client, nodeName, cfg, opts...)
	if err != nil {
		return err
	}
	// kube-proxy announces its start on the Node when its proxier
	// starts; with --once and --dry-run too. The post runs beside the
	// first sync and is waited for before returning.
	posted := make(chan struct{})
	go func() {
		defer close(posted)
		recordStart(ctx, client, nodeName)
	}()
	if !longRunning {
		err := p.RunOnce(ctx)
		<-posted
		return err
	}

	var wg sync.WaitGroup
	defer func() {
		cancel() // the metrics server stops with ctx
		wg.Wait()
		<-posted
	}()
	failed := make(chan error, 1)
	effective := effectiveConfig(o)
	if js, err := json.Marshal(effective); err == nil {
		klog.FromContext(ctx).V(1).Info("Effective configuration", "config", string(js))
	}
	if o.metricsBindAddress != "" {
		configz, err := configzHandler(effective)
		if err != nil {
			return err
		}
		if err := serveMetrics(ctx, &wg, env.Listen, o.metricsBindAddress, reg, configz, failed); err != nil {
			return err
		}
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	select {
	case err = <-done:
	case err = <-failed:
		cancel()
		<-done
	}
	return err
}

// openCluster returns the client informers are built on: the fake cluster
// of --manifests (followed for changes when follow is set), or the API
// server of --kubeconfig and --master, or the one the proxier runs in.
func openCluster(ctx context.Context, o *options, env *environment, follow bool) (kubernetes.Interface, error) {
	if env.client != nil {
		return env.client, nil
	}
	logger := klog.FromContext(ctx)
	if o.manifests != "" {
		src, problems, err := manifests.New(ctx, o.manifests)
		manifests.LogProblems(logger, problems)
		if err != nil {
			return nil, err
		}
		if follow {
			if err := src.Watch(ctx, manifestSettle); err != nil {
				return nil, err
			}
		}
		return src.Client(), nil
	}
	cfg, err := apiServerConfig(o, rest.InClusterConfig)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("API server client: %w", err)
	}
	return client, nil
}

// serveMetrics starts the metrics server, /metrics and /configz, as
// kube-proxy's; the listener is opened here so that a bad or busy address
// fails the start-up.
func serveMetrics(ctx context.Context, wg *sync.WaitGroup, listen healthz.ListenFunc, addr string, reg *prometheus.Registry, configz http.Handler, failed chan<- error) error {
	l, err := listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics server: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/configz", configz)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	wg.Go(func() {
		if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
			failed <- fmt.Errorf("metrics server: %w", err)
		}
	})
	wg.Go(func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	})
	return nil
}
