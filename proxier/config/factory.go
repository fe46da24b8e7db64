package config

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

// ServiceProxyNameLabel is the label by which a Service asks to be handled by
// a proxy other than the default one. The EndpointSlice controller mirrors it
// onto the Service's slices, but the proxies select slices without it.
const ServiceProxyNameLabel = "service.kubernetes.io/service-proxy-name"

// InformerFactoryOption configures NewServiceInformerFactory.
type InformerFactoryOption func(*factoryOptions)

type factoryOptions struct {
	proxyName string
}

// WithServiceProxyName makes the Service factory select the Services
// labelled service.kubernetes.io/service-proxy-name=name, for a proxy that
// implements Services the default proxy must leave alone. An empty name
// keeps the default (only Services without the label).
func WithServiceProxyName(name string) InformerFactoryOption {
	return func(o *factoryOptions) { o.proxyName = name }
}

// ServiceLabelSelector returns kube-proxy's label selector for Services: with
// an empty proxyName, no service.kubernetes.io/service-proxy-name label; with
// a proxyName, that label equal to it (an invalid label value selects
// nothing). It does not look at service.kubernetes.io/headless: kube-proxy
// leaves headless Services out by their cluster IP (ServiceFieldSelector), so
// a ClusterIP Service that carries the label is still proxied.
func ServiceLabelSelector(proxyName string) labels.Selector {
	var req *labels.Requirement
	if proxyName == "" {
		// A constant key: NewRequirement cannot fail.
		req, _ = labels.NewRequirement(ServiceProxyNameLabel, selection.DoesNotExist, nil)
	} else {
		var err error
		req, err = labels.NewRequirement(ServiceProxyNameLabel, selection.Equals, []string{proxyName})
		if err != nil {
			// An invalid label value matches no object; say so in the
			// selector rather than selecting everything.
			req, _ = labels.NewRequirement(ServiceProxyNameLabel, selection.In, []string{})
		}
	}
	if req == nil {
		return labels.Nothing()
	}
	return labels.NewSelector().Add(*req)
}

// ServiceFieldSelector returns kube-proxy's field selector for Services,
// spec.clusterIP!=None: headless Services are served by DNS, not by the
// proxy. The API server evaluates it; client-go's fake clientset does not.
func ServiceFieldSelector() fields.Selector {
	return fields.OneTermNotEqualSelector("spec.clusterIP", v1.ClusterIPNone)
}

// EndpointSliceLabelSelector returns kube-proxy's label selector for
// EndpointSlices: no service.kubernetes.io/headless label (the EndpointSlice
// controller copies it from headless Services). It does not look at
// service.kubernetes.io/service-proxy-name: a slice belongs to the proxy that
// handles its Service, which the Service's own label decides, so a Service
// whose label was removed while its slices still carry it is proxied with its
// endpoints.
func EndpointSliceLabelSelector() labels.Selector {
	// A constant key: NewRequirement cannot fail.
	req, _ := labels.NewRequirement(v1.IsHeadlessService, selection.DoesNotExist, nil)
	if req == nil {
		return labels.Nothing()
	}
	return labels.NewSelector().Add(*req)
}

// NewServiceInformerFactory returns a SharedInformerFactory for the Service
// informer of NewServiceConfig: it lists only the Services a proxy handles,
// by ServiceLabelSelector and ServiceFieldSelector as kube-proxy does,
// resyncing every resyncPeriod (0: never). Use its Core().V1().Services()
// informer only: the field selector is one the API server accepts for
// Services alone. Start it with the factory of NewEndpointSliceInformerFactory.
// The informer caches and delivers Services without their managed fields
// and kubectl's kubectl.kubernetes.io/last-applied-configuration
// annotation (a copy of the whole object), which no proxier reads.
func NewServiceInformerFactory(client kubernetes.Interface, resyncPeriod time.Duration, opts ...InformerFactoryOption) informers.SharedInformerFactory {
	var o factoryOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	labelSelector := ServiceLabelSelector(o.proxyName).String()
	fieldSelector := ServiceFieldSelector().String()
	return informers.NewSharedInformerFactoryWithOptions(client, resyncPeriod,
		informers.WithTransform(trimService),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.LabelSelector = labelSelector
			lo.FieldSelector = fieldSelector
		}))
}

// NewEndpointSliceInformerFactory returns a SharedInformerFactory for the
// EndpointSlice informer of NewEndpointSliceConfig: it lists the slices that
// are not headless (EndpointSliceLabelSelector), as kube-proxy does,
// resyncing every resyncPeriod (0: never). The informer caches and
// delivers slices cut down to what the endpoint tracker reads (see
// changetracker.EndpointsChangeTracker.EndpointSliceUpdate): no managed
// fields or owner references, no labels but kubernetes.io/service-name,
// no annotations but endpoints.kubernetes.io/last-change-trigger-time, and
// no target reference, hostname or deprecated topology in the endpoints.
func NewEndpointSliceInformerFactory(client kubernetes.Interface, resyncPeriod time.Duration) informers.SharedInformerFactory {
	selector := EndpointSliceLabelSelector().String()
	return informers.NewSharedInformerFactoryWithOptions(client, resyncPeriod,
		informers.WithTransform(trimEndpointSlice),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.LabelSelector = selector
		}))
}

// NewNodeInformerFactory returns a SharedInformerFactory whose Node informer
// watches only the node named nodeName, for NodeConfig and NodeTopology.
// The informer caches and delivers the Node without its managed fields.
func NewNodeInformerFactory(client kubernetes.Interface, nodeName string, resyncPeriod time.Duration) informers.SharedInformerFactory {
	selector := fields.OneTermEqualSelector(metav1.ObjectNameField, nodeName).String()
	return informers.NewSharedInformerFactoryWithOptions(client, resyncPeriod,
		informers.WithTransform(trimManagedFields),
		informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
			lo.FieldSelector = selector
		}))
}
