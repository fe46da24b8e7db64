package changetracker

import (
	"maps"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// NodeTopology follows one node: its topology labels
// (topology.kubernetes.io/zone, the one CategorizeEndpoints reads) and its
// deletion. Its OnNode* methods are those of the proxier/config package's
// NodeHandler, so that a NodeConfig feeds it from a Node informer; this
// package itself compiles no informer. A proxier passes Labels() to
// CategorizeEndpoints and resyncs when they change. It is safe for concurrent use.
type NodeTopology struct {
	nodeName string
	logger   klog.Logger
	onChange func(labels map[string]string)
	onDelete func()

	mu      sync.Mutex
	labels  map[string]string
	seen    bool
	deleted bool
}

// OnTopologyChange sets a function called, on the informer's goroutine, with
// the new topology labels whenever they change (including the first time the
// node is seen with any). The map is the caller's to keep. Read by
// NewNodeTopology only.
func OnTopologyChange(f func(labels map[string]string)) Option {
	return func(o *options) { o.onTopologyChange = f }
}

// OnNodeDeleted sets a function called, on the informer's goroutine, when the
// node is deleted. kube-proxy keeps running in that case; what to do (exit,
// report unhealthy) is the caller's decision. Read by NewNodeTopology only.
func OnNodeDeleted(f func()) Option {
	return func(o *options) { o.onNodeDeleted = f }
}

// NewNodeTopology returns a NodeTopology for the node named nodeName. Events
// about other nodes are ignored. It reads WithLogger, OnTopologyChange and
// OnNodeDeleted, and ignores the trackers' options.
func NewNodeTopology(nodeName string, opts ...Option) *NodeTopology {
	o := newOptions(opts)
	return &NodeTopology{
		nodeName: nodeName,
		logger:   o.logger,
		onChange: o.onTopologyChange,
		onDelete: o.onNodeDeleted,
		labels:   map[string]string{},
	}
}

// Labels returns a copy of the node's topology labels; empty (not nil) before
// the node is seen, after it is deleted, or when it has none.
func (n *NodeTopology) Labels() map[string]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return maps.Clone(n.labels)
}

// Deleted reports whether the node has been deleted (and not recreated).
func (n *NodeTopology) Deleted() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.deleted
}

// Seen reports whether the node has been added or updated at least once.
func (n *NodeTopology) Seen() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.seen
}

// OnNodeAdd records the node's labels (part of config.NodeHandler).
func (n *NodeTopology) OnNodeAdd(node *v1.Node) { n.set(node) }

// OnNodeUpdate records the node's new labels (part of config.NodeHandler).
func (n *NodeTopology) OnNodeUpdate(_, node *v1.Node) { n.set(node) }

// OnNodeDelete marks the node deleted and its labels empty (part of
// config.NodeHandler).
func (n *NodeTopology) OnNodeDelete(node *v1.Node) {
	if node == nil || node.Name != n.nodeName {
		return
	}
	n.mu.Lock()
	n.deleted = true
	changed := len(n.labels) > 0
	n.labels = map[string]string{}
	onChange, onDelete := n.onChange, n.onDelete
	n.mu.Unlock()
	n.logger.Info("Node deleted", "node", n.nodeName)
	if changed && onChange != nil {
		onChange(map[string]string{})
	}
	if onDelete != nil {
		onDelete()
	}
}

// OnNodeSynced does nothing (part of config.NodeHandler).
func (n *NodeTopology) OnNodeSynced() {}

func (n *NodeTopology) set(node *v1.Node) {
	if node == nil || node.Name != n.nodeName {
		return
	}
	// Only the zone label affects CategorizeEndpoints; following other
	// labels would trigger syncs for nothing.
	labels := map[string]string{}
	if v, ok := node.Labels[v1.LabelTopologyZone]; ok {
		labels[v1.LabelTopologyZone] = v
	}
	n.mu.Lock()
	n.seen, n.deleted = true, false
	changed := !maps.Equal(labels, n.labels)
	if changed {
		n.labels = labels
	}
	onChange := n.onChange
	n.mu.Unlock()
	if changed {
		n.logger.V(2).Info("Node topology changed", "node", n.nodeName, "labels", labels)
		if onChange != nil {
			onChange(maps.Clone(labels))
		}
	}
}
