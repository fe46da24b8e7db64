package changetracker

import (
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
)

// ServiceProxyNameLabel is the label by which a Service (and, mirrored by the
// EndpointSlice controller, its slices) asks to be handled by a proxy other
// than the default one.
const ServiceProxyNameLabel = "service.kubernetes.io/service-proxy-name"

// InformerFactoryOption configures NewInformerFactory.
type InformerFactoryOption func(*factoryOptions)

type factoryOptions struct {
	proxyName string
}

// WithServiceProxyName makes the factory select the Services and slices
// labelled service.kubernetes.io/service-proxy-name=name, for a proxy that
// implements Services the default proxy must leave alone. An empty name
// keeps the default (only unlabelled objects).
func WithServiceProxyName(name string) InformerFactoryOption {
	return func(o *factoryOptions) { o.proxyName = name }
}

// ProxyLabelSelector returns kube-proxy's selector for Services and
// EndpointSlices: not headless (no service.kubernetes.io/headless label) and,
// with an empty proxyName, no service.kubernetes.io/service-proxy-name label;
// with a proxyName, that label equal to it.
func ProxyLabelSelector(proxyName string) labels.Selector {
	// The inputs are constants and a label value checked below, so
	// NewRequirement cannot fail except for an invalid proxyName.
	headless, _ := labels.NewRequirement(v1.IsHeadlessService, selection.DoesNotExist, nil)
	var proxy *labels.Requirement
	if proxyName == "" {
		proxy, _ = labels.NewRequirement(ServiceProxyNameLabel, selection.DoesNotExist, nil)
	} else {
		var err error
		proxy, err = labels.NewRequirement(ServiceProxyNameLabel, selection.Equals, []string{proxyName})
		if err != nil {
			// An invalid label value matches no object; say so in the
			// selector rather than selecting everything.
			proxy, _ = labels.NewRequirement(ServiceProxyNameLabel, selection.In, []string{})
		}
	}
	sel := labels.NewSelector()
	if proxy != nil {
		sel = sel.Add(*proxy)
	}
	if headless != nil {
		sel = sel.Add(*headless)
	}
	return sel
}

// NewInformerFactory returns a SharedInformerFactory whose informers list
// only what a proxy handles (see ProxyLabelSelector), resyncing every
// resyncPeriod (0: never). Use its Core().V1().Services() and
// Discovery().V1().EndpointSlices() informers with NewServiceConfig and
// NewEndpointSliceConfig, then Start it.
func NewInformerFactory(client kubernetes.Interface, resyncPeriod time.Duration, opts ...InformerFactoryOption) informers.SharedInformerFactory {
	var o factoryOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	selector := ProxyLabelSelector(o.proxyName).String()
	return informers.NewSharedInformerFactoryWithOptions(client, resyncPeriod,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.LabelSelector = selector
		}))
}

// NewNodeInformerFactory returns a SharedInformerFactory whose Node informer
// watches only the node named nodeName, for NodeConfig and NodeTopology.
func NewNodeInformerFactory(client kubernetes.Interface, nodeName string, resyncPeriod time.Duration) informers.SharedInformerFactory {
	selector := fields.OneTermEqualSelector(metav1.ObjectNameField, nodeName).String()
	return informers.NewSharedInformerFactoryWithOptions(client, resyncPeriod,
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = selector
		}))
}
