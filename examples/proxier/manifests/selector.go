package manifests

import (
	"fmt"
	"strconv"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// selection is the label and field selector of a list or watch, as an API
// server applies them. The zero value selects everything.
type selection struct {
	label labels.Selector
	field fields.Selector
}

// selectableFields are the field labels an API server accepts in a field
// selector for each resource this package serves; any other label is
// refused, as the server's field label conversion refuses it. The metadata
// fields are the ones every resource has (metadata.namespace only
// namespaced ones, Nodes not even that).
var selectableFields = map[string]map[string]bool{
	"services":       {metav1.ObjectNameField: true, "metadata.namespace": true, "spec.clusterIP": true, "spec.type": true},
	"endpointslices": {metav1.ObjectNameField: true, "metadata.namespace": true},
	"nodes":          {metav1.ObjectNameField: true, "spec.unschedulable": true},
	"servicecidrs":   {metav1.ObjectNameField: true, "metadata.namespace": true},
}

// newSelection parses opts' selectors for resource gvr. A selector that
// does not parse, or a field the API server cannot select gvr by, is a
// 400 Bad Request, as from an API server.
func newSelection(gvr schema.GroupVersionResource, opts metav1.ListOptions) (selection, error) {
	var s selection
	if opts.LabelSelector != "" {
		sel, err := labels.Parse(opts.LabelSelector)
		if err != nil {
			return s, apierrors.NewBadRequest(fmt.Sprintf("%s: invalid label selector %q: %v", gvr.Resource, opts.LabelSelector, err))
		}
		if !sel.Empty() {
			s.label = sel
		}
	}
	if opts.FieldSelector != "" {
		sel, err := fields.ParseSelector(opts.FieldSelector)
		if err != nil {
			return s, apierrors.NewBadRequest(fmt.Sprintf("%s: invalid field selector %q: %v", gvr.Resource, opts.FieldSelector, err))
		}
		known, ok := selectableFields[gvr.Resource]
		if !ok {
			known = map[string]bool{metav1.ObjectNameField: true, "metadata.namespace": true}
		}
		sel, err = sel.Transform(func(field, value string) (string, string, error) {
			if !known[field] {
				return "", "", fmt.Errorf("field label not supported: %s", field)
			}
			return field, value, nil
		})
		if err != nil {
			return s, apierrors.NewBadRequest(err.Error())
		}
		if !sel.Empty() {
			s.field = sel
		}
	}
	return s, nil
}

// all reports whether s selects every object.
func (s selection) all() bool { return s.label == nil && s.field == nil }

// matches reports whether obj is selected. Objects without metadata never
// are, unless s selects everything.
func (s selection) matches(obj runtime.Object) bool {
	if s.all() {
		return true
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return false
	}
	if s.label != nil && !s.label.Matches(labels.Set(m.GetLabels())) {
		return false
	}
	return s.field == nil || s.field.Matches(objectFields(obj, m))
}

// objectFields returns the fields of obj that a field selector can test,
// as the API server sets them for its kind: the name, the namespace of
// namespaced objects, and the few spec fields of Services and Nodes.
func objectFields(obj runtime.Object, m metav1.Object) fields.Set {
	set := fields.Set{metav1.ObjectNameField: m.GetName()}
	switch o := obj.(type) {
	case *v1.Service:
		set["metadata.namespace"] = o.Namespace
		set["spec.clusterIP"] = o.Spec.ClusterIP
		// The API server stores the default type of a Service that names
		// none; a manifest need not name it.
		set["spec.type"] = string(o.Spec.Type)
		if o.Spec.Type == "" {
			set["spec.type"] = string(v1.ServiceTypeClusterIP)
		}
	case *v1.Node:
		set["spec.unschedulable"] = strconv.FormatBool(o.Spec.Unschedulable)
	default:
		if ns := m.GetNamespace(); ns != "" {
			set["metadata.namespace"] = ns
		}
	}
	return set
}
