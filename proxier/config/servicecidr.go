package config

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	networkinginformers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/internal/logsafe"
)

// ServiceCIDRHandler receives ServiceCIDR (networking.k8s.io/v1) events
// from a ServiceCIDRConfig, like ServiceHandler.
type ServiceCIDRHandler interface {
	// OnServiceCIDRAdd is called when a ServiceCIDR is created or first
	// listed.
	OnServiceCIDRAdd(cidr *networkingv1.ServiceCIDR)
	// OnServiceCIDRUpdate is called when a ServiceCIDR changes (its
	// status or metadata: the API server keeps spec.cidrs immutable), and
	// on resyncs.
	OnServiceCIDRUpdate(oldCIDR, cidr *networkingv1.ServiceCIDR)
	// OnServiceCIDRDelete is called when a ServiceCIDR is deleted, with
	// its last known state (unwrapped from a tombstone if need be).
	OnServiceCIDRDelete(cidr *networkingv1.ServiceCIDR)
	// OnServiceCIDRsSynced is called once, after the initial list, if
	// Run saw it delivered.
	OnServiceCIDRsSynced()
}

// ErrServiceCIDRsUnavailable is what ServiceCIDRConfig.Run returns, wrapped
// with the cause, when the ServiceCIDRs cannot be listed.
var ErrServiceCIDRsUnavailable = errors.New("ServiceCIDRs cannot be listed")

// ServiceCIDRConfig delivers ServiceCIDR events from an informer to
// ServiceCIDRHandlers. Unlike the other configs, its Run does not wait
// through a failing list: API servers before Kubernetes 1.33 do not serve
// networking.k8s.io/v1 ServiceCIDRs, and a proxy's RBAC may not allow
// them, while a proxy works without them.
type ServiceCIDRConfig struct {
	c eventConfig[*networkingv1.ServiceCIDR]

	failOnce sync.Once
	failed   chan struct{} // closed at the first failure before the list
	mu       sync.Mutex
	failure  error
}

// NewServiceCIDRConfig registers a ServiceCIDRConfig on informer; see
// NewServiceConfig. It also sets the informer's watch error handler (so
// create it before starting the factory), which logs the first failure to
// list through klog.FromContext(ctx) and later ones at V(4) until a list
// succeeds, and then logs as client-go does. It fails if the informer has
// started or stopped.
func NewServiceCIDRConfig(ctx context.Context, informer networkinginformers.ServiceCIDRInformer, resyncPeriod time.Duration) (*ServiceCIDRConfig, error) {
	c := &ServiceCIDRConfig{c: eventConfig[*networkingv1.ServiceCIDR]{kind: "ServiceCIDR"}, failed: make(chan struct{})}
	inf := informer.Informer()
	if err := c.c.register(ctx, inf, resyncPeriod); err != nil {
		return nil, err
	}
	if err := inf.SetWatchErrorHandlerWithContext(c.watchError); err != nil {
		return nil, fmt.Errorf("setting the ServiceCIDR watch error handler: %w", err)
	}
	return c, nil
}

func (c *ServiceCIDRConfig) watchError(ctx context.Context, r *cache.Reflector, err error) {
	if c.c.synced != nil && c.c.synced() {
		cache.DefaultWatchErrorHandler(ctx, r, err)
		return
	}
	first := false
	c.failOnce.Do(func() {
		c.mu.Lock()
		c.failure = err
		c.mu.Unlock()
		close(c.failed)
		first = true
	})
	logger := klog.FromContext(ctx)
	if first {
		logger.Info("Cannot list ServiceCIDRs (an API server before 1.33, or RBAC without them); going on without them and trying again in the background", "err", logsafe.Quote(err.Error()))
		return
	}
	logger.V(4).Info("Still cannot list ServiceCIDRs", "err", logsafe.Quote(err.Error()))
}

// RegisterEventHandler adds a handler; see ServiceConfig.RegisterEventHandler.
func (c *ServiceCIDRConfig) RegisterEventHandler(handler ServiceCIDRHandler) {
	c.c.add(eventHandler[*networkingv1.ServiceCIDR]{
		add: handler.OnServiceCIDRAdd, update: handler.OnServiceCIDRUpdate,
		del: handler.OnServiceCIDRDelete, synced: handler.OnServiceCIDRsSynced,
	})
}

// Run waits until the informer has delivered its initial list to the
// handlers, then calls their OnServiceCIDRsSynced and returns nil. When
// listing fails first (the resource is not served, or not allowed), it
// returns at once an error that wraps ErrServiceCIDRsUnavailable and the
// cause: the informer keeps trying with backoff, and once a list succeeds
// its objects reach the handlers as adds, but OnServiceCIDRsSynced is not
// called. It returns ctx.Err() if ctx ends first.
func (c *ServiceCIDRConfig) Run(ctx context.Context) error {
	klog.FromContext(ctx).Info("Starting config controller", "kind", c.c.kind)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if c.c.synced() {
			for _, h := range c.c.snapshot() {
				h.synced()
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.failed:
			c.mu.Lock()
			defer c.mu.Unlock()
			return fmt.Errorf("%w: %w", ErrServiceCIDRsUnavailable, c.failure)
		case <-tick.C:
		}
	}
}
