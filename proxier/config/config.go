package config

import (
	"context"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/changetracker"
)

// ServiceHandler receives Service events from a ServiceConfig. Methods are
// called from the informer's goroutine, one at a time, and should only record
// the change (ServiceChangeTracker.Update) and ask for a sync.
type ServiceHandler interface {
	// OnServiceAdd is called when a Service is created or first listed.
	OnServiceAdd(service *v1.Service)
	// OnServiceUpdate is called when a Service changes, and on resyncs
	// (with oldService and service carrying the same resourceVersion).
	OnServiceUpdate(oldService, service *v1.Service)
	// OnServiceDelete is called when a Service is deleted. service is the
	// last state the informer knew, unwrapped from a tombstone if the
	// deletion was missed.
	OnServiceDelete(service *v1.Service)
	// OnServiceSynced is called once, after the initial list has been
	// delivered to this handler.
	OnServiceSynced()
}

// EndpointSliceHandler receives EndpointSlice events from an
// EndpointSliceConfig, like ServiceHandler.
type EndpointSliceHandler interface {
	// OnEndpointSliceAdd is called when a slice is created or first listed.
	OnEndpointSliceAdd(slice *discoveryv1.EndpointSlice)
	// OnEndpointSliceUpdate is called when a slice changes, and on resyncs.
	OnEndpointSliceUpdate(oldSlice, newSlice *discoveryv1.EndpointSlice)
	// OnEndpointSliceDelete is called when a slice is deleted, with its
	// last known state (unwrapped from a tombstone if need be).
	OnEndpointSliceDelete(slice *discoveryv1.EndpointSlice)
	// OnEndpointSlicesSynced is called once, after the initial list.
	OnEndpointSlicesSynced()
}

// NodeHandler receives Node events from a NodeConfig, like ServiceHandler.
// changetracker.NodeTopology is an implementation that follows this node's
// labels.
type NodeHandler interface {
	// OnNodeAdd is called when a Node is created or first listed.
	OnNodeAdd(node *v1.Node)
	// OnNodeUpdate is called when a Node changes, and on resyncs.
	OnNodeUpdate(oldNode, node *v1.Node)
	// OnNodeDelete is called when a Node is deleted, with its last known
	// state (unwrapped from a tombstone if need be).
	OnNodeDelete(node *v1.Node)
	// OnNodeSynced is called once, after the initial list.
	OnNodeSynced()
}

var _ NodeHandler = (*changetracker.NodeTopology)(nil)

// eventConfig is the part common to the three config types: a list of
// handlers fed from one informer registration.
type eventConfig[T any] struct {
	kind   string
	synced cache.InformerSynced

	mu       sync.RWMutex
	handlers []eventHandler[T]
}

type eventHandler[T any] struct {
	add    func(T)
	update func(T, T)
	del    func(T)
	synced func()
}

// register adds the config's dispatch to informer. Events for objects that
// are not T are logged and dropped.
func (c *eventConfig[T]) register(ctx context.Context, informer cache.SharedIndexInformer, resyncPeriod time.Duration) error {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "kind", c.kind)
	reg, err := informer.AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			o, ok := obj.(T)
			if !ok {
				logger.Error(nil, "Ignoring added object of unexpected type", "type", fmt.Sprintf("%T", obj))
				return
			}
			for _, h := range c.snapshot() {
				h.add(o)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(T)
			n, ok2 := newObj.(T)
			if !ok1 || !ok2 {
				logger.Error(nil, "Ignoring updated object of unexpected type", "oldType", fmt.Sprintf("%T", oldObj), "newType", fmt.Sprintf("%T", newObj))
				return
			}
			for _, h := range c.snapshot() {
				h.update(o, n)
			}
		},
		DeleteFunc: func(obj any) {
			o, ok := unwrapTombstone[T](obj)
			if !ok {
				logger.Error(nil, "Ignoring deleted object of unexpected type", "type", fmt.Sprintf("%T", obj))
				return
			}
			for _, h := range c.snapshot() {
				h.del(o)
			}
		},
	}, cache.HandlerOptions{Logger: &logger, ResyncPeriod: &resyncPeriod})
	if err != nil {
		return fmt.Errorf("registering %s event handler: %w", c.kind, err)
	}
	c.synced = reg.HasSynced
	return nil
}

// unwrapTombstone returns the object of a delete event, which is either the
// object itself or, when the informer missed the deletion (a watch gap), a
// DeletedFinalStateUnknown holding the last known state.
func unwrapTombstone[T any](obj any) (T, bool) {
	if o, ok := obj.(T); ok {
		return o, true
	}
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		o, ok := tomb.Obj.(T)
		return o, ok
	}
	var zero T
	return zero, false
}

func (c *eventConfig[T]) add(h eventHandler[T]) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handlers = append(c.handlers, h)
}

func (c *eventConfig[T]) snapshot() []eventHandler[T] {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.handlers
}

// run waits for the informer's initial list to reach the handlers, then calls
// their synced funcs.
func (c *eventConfig[T]) run(ctx context.Context) bool {
	logger := klog.FromContext(ctx)
	logger.Info("Starting config controller", "kind", c.kind)
	if !cache.WaitForNamedCacheSyncWithContext(ctx, c.synced) {
		logger.Info("Stopped before the cache synced", "kind", c.kind)
		return false
	}
	for _, h := range c.snapshot() {
		h.synced()
	}
	return true
}

// ServiceConfig delivers Service events from a Service informer to
// ServiceHandlers.
type ServiceConfig struct {
	c eventConfig[*v1.Service]
}

// NewServiceConfig registers a ServiceConfig on informer, asking for resyncs
// every resyncPeriod (0: none). It logs through klog.FromContext(ctx). Create
// it before starting the informer factory, and register handlers before Run.
// It fails only if the informer refuses the registration (it has stopped).
func NewServiceConfig(ctx context.Context, informer coreinformers.ServiceInformer, resyncPeriod time.Duration) (*ServiceConfig, error) {
	c := &ServiceConfig{c: eventConfig[*v1.Service]{kind: "Service"}}
	if err := c.c.register(ctx, informer.Informer(), resyncPeriod); err != nil {
		return nil, err
	}
	return c, nil
}

// RegisterEventHandler adds a handler. Handlers added after Run miss the
// synced call but get later events.
func (c *ServiceConfig) RegisterEventHandler(handler ServiceHandler) {
	c.c.add(eventHandler[*v1.Service]{
		add: handler.OnServiceAdd, update: handler.OnServiceUpdate,
		del: handler.OnServiceDelete, synced: handler.OnServiceSynced,
	})
}

// Run waits until the informer has delivered its initial list to the
// handlers, then calls their OnServiceSynced, and returns true. It returns
// false, without calling them, if ctx ends first.
func (c *ServiceConfig) Run(ctx context.Context) bool { return c.c.run(ctx) }

// EndpointSliceConfig delivers EndpointSlice events from an informer to
// EndpointSliceHandlers.
type EndpointSliceConfig struct {
	c eventConfig[*discoveryv1.EndpointSlice]
}

// NewEndpointSliceConfig registers an EndpointSliceConfig on informer; see
// NewServiceConfig.
func NewEndpointSliceConfig(ctx context.Context, informer discoveryinformers.EndpointSliceInformer, resyncPeriod time.Duration) (*EndpointSliceConfig, error) {
	c := &EndpointSliceConfig{c: eventConfig[*discoveryv1.EndpointSlice]{kind: "EndpointSlice"}}
	if err := c.c.register(ctx, informer.Informer(), resyncPeriod); err != nil {
		return nil, err
	}
	return c, nil
}

// RegisterEventHandler adds a handler; see ServiceConfig.RegisterEventHandler.
func (c *EndpointSliceConfig) RegisterEventHandler(handler EndpointSliceHandler) {
	c.c.add(eventHandler[*discoveryv1.EndpointSlice]{
		add: handler.OnEndpointSliceAdd, update: handler.OnEndpointSliceUpdate,
		del: handler.OnEndpointSliceDelete, synced: handler.OnEndpointSlicesSynced,
	})
}

// Run waits for the initial list, then calls OnEndpointSlicesSynced; see
// ServiceConfig.Run.
func (c *EndpointSliceConfig) Run(ctx context.Context) bool { return c.c.run(ctx) }

// NodeConfig delivers Node events from an informer to NodeHandlers.
type NodeConfig struct {
	c eventConfig[*v1.Node]
}

// NewNodeConfig registers a NodeConfig on informer; see NewServiceConfig. A
// proxy usually watches only its own Node (NewNodeInformerFactory).
func NewNodeConfig(ctx context.Context, informer coreinformers.NodeInformer, resyncPeriod time.Duration) (*NodeConfig, error) {
	c := &NodeConfig{c: eventConfig[*v1.Node]{kind: "Node"}}
	if err := c.c.register(ctx, informer.Informer(), resyncPeriod); err != nil {
		return nil, err
	}
	return c, nil
}

// RegisterEventHandler adds a handler; see ServiceConfig.RegisterEventHandler.
func (c *NodeConfig) RegisterEventHandler(handler NodeHandler) {
	c.c.add(eventHandler[*v1.Node]{
		add: handler.OnNodeAdd, update: handler.OnNodeUpdate,
		del: handler.OnNodeDelete, synced: handler.OnNodeSynced,
	})
}

// Run waits for the initial list, then calls OnNodeSynced; see
// ServiceConfig.Run.
func (c *NodeConfig) Run(ctx context.Context) bool { return c.c.run(ctx) }
