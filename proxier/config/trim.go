package config

import (
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
)

// lastApplied is the annotation in which kubectl apply keeps a second copy
// of the whole object, as JSON.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// trimManagedFields drops an object's managed fields before its informer
// caches it: the API server's record of which client set which field, as
// large as the fields themselves, which no proxy reads. kube-proxy drops
// them too.
func trimManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// trimService drops from a Service what no proxier reads before its
// informer caches it: the managed fields and kubectl's last-applied copy
// of the object. Everything else stays, for a MakeServicePortFunc that
// reads labels or annotations of its own.
func trimService(obj any) (any, error) {
	if svc, ok := obj.(*v1.Service); ok {
		svc.ManagedFields = nil
		delete(svc.Annotations, lastApplied)
	}
	return obj, nil
}

// trimEndpointSlice keeps of an EndpointSlice what the endpoint tracker
// reads, before its informer caches it: the cache holds every slice of the
// cluster, and the tracker keeps what it needs of them in its own form.
// It drops the managed fields, owner references, every label but
// kubernetes.io/service-name, every annotation but
// endpoints.kubernetes.io/last-change-trigger-time, and each endpoint's
// target reference, hostname and deprecated topology.
func trimEndpointSlice(obj any) (any, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return obj, nil
	}
	s.ManagedFields = nil
	s.OwnerReferences = nil
	s.GenerateName = ""
	s.Labels = keepOnly(s.Labels, discoveryv1.LabelServiceName)
	s.Annotations = keepOnly(s.Annotations, v1.EndpointsLastChangeTriggerTime)
	for i := range s.Endpoints {
		ep := &s.Endpoints[i]
		ep.TargetRef = nil
		ep.Hostname = nil
		ep.DeprecatedTopology = nil
	}
	return s, nil
}

// keepOnly returns m with key alone, or nil when m does not have it; m is
// returned as it is when key is its only entry.
func keepOnly(m map[string]string, key string) map[string]string {
	v, ok := m[key]
	switch {
	case !ok:
		return nil
	case len(m) == 1:
		return m
	}
	return map[string]string{key: v}
}
