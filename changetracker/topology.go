package changetracker

import (
	v1 "k8s.io/api/core/v1"
)

// CategorizeEndpoints sorts the endpoints of one service port into what a
// proxier programs on this node:
//
//   - clusterEndpoints: the endpoints for traffic under the Cluster policy,
//     after topology; nil when the port never uses Cluster policy
//     (svc.UsesClusterEndpoints is false).
//   - localEndpoints: the endpoints on this node for traffic under the Local
//     policy; nil when the port never uses Local policy
//     (svc.UsesLocalEndpoints is false) or none is usable.
//   - allReachableEndpoints: the union of the two, in the order of endpoints
//     (the same slice as one of them when it contains the other).
//   - hasAnyEndpoints: whether the port has a usable endpoint anywhere in the
//     cluster, even if none is reachable from this node, so that a proxier
//     can tell "reject: no endpoints" from "drop: none here".
//
// Usable means ready; when there are no ready endpoints (counted separately
// for Cluster and Local) it falls back to endpoints that are serving and
// terminating, so that connections drain during a rollout.
//
// Topology: when every ready endpoint has node hints and one is hinted for
// nodeName, Cluster traffic uses only the endpoints hinted for this node
// (PreferSameNode). Otherwise, when every ready endpoint has zone hints and
// one is hinted for this node's zone (nodeLabels[topology.kubernetes.io/zone]),
// it uses only the endpoints hinted for that zone (PreferSameZone, also set by
// the older PreferClose and by topology-aware routing). Otherwise hints are
// ignored. Hints never restrict Local traffic.
//
// With no endpoints, or a nil svc, all results are empty. endpoints is not
// modified; a result may share its array (the whole of it, when every
// endpoint is kept), so the results are read-only as the map's lists are.
func CategorizeEndpoints(endpoints []Endpoint, svc ServicePort, nodeName string, nodeLabels map[string]string) (clusterEndpoints, localEndpoints, allReachableEndpoints []Endpoint, hasAnyEndpoints bool) {
	if len(endpoints) == 0 || isNil(svc) {
		return nil, nil, nil, false
	}
	zone := nodeLabels[v1.LabelTopologyZone]
	var mode topologyMode

	inCluster := func(Endpoint) bool { return false }
	if svc.UsesClusterEndpoints() {
		mode = topologyModeFromHints(endpoints, nodeName, zone)
		inCluster = func(ep Endpoint) bool { return ep.IsReady() && mode.allows(ep, nodeName, zone) }
		clusterEndpoints = filterEndpoints(endpoints, inCluster)
		// Topology falls back to "all" when no ready endpoint matches it,
		// so an empty list here means no ready endpoint anywhere.
		if len(clusterEndpoints) == 0 {
			inCluster = servingTerminating
			clusterEndpoints = filterEndpoints(endpoints, inCluster)
		}
		hasAnyEndpoints = len(clusterEndpoints) > 0
	}

	if !svc.UsesLocalEndpoints() {
		return clusterEndpoints, nil, clusterEndpoints, hasAnyEndpoints
	}

	var localReady, localServingTerminating bool
	for _, ep := range endpoints {
		switch {
		case ep.IsReady():
			hasAnyEndpoints = true
			localReady = localReady || ep.IsLocal()
		case servingTerminating(ep):
			hasAnyEndpoints = true
			localServingTerminating = localServingTerminating || ep.IsLocal()
		}
	}
	inLocal := func(Endpoint) bool { return false }
	switch {
	case localReady:
		inLocal = func(ep Endpoint) bool { return ep.IsLocal() && ep.IsReady() }
	case localServingTerminating:
		inLocal = func(ep Endpoint) bool { return ep.IsLocal() && servingTerminating(ep) }
	}
	localEndpoints = filterEndpoints(endpoints, inLocal)

	if !svc.UsesClusterEndpoints() {
		return nil, localEndpoints, localEndpoints, hasAnyEndpoints
	}
	if mode == topologyNone && !localServingTerminatingOnly(localReady, localServingTerminating) {
		// clusterEndpoints then holds every ready endpoint (or, with no
		// ready endpoint anywhere, every serving-terminating one), local
		// ones included, and localEndpoints a subset of it.
		return clusterEndpoints, localEndpoints, clusterEndpoints, hasAnyEndpoints
	}
	switch {
	case len(localEndpoints) == 0:
		return clusterEndpoints, nil, clusterEndpoints, hasAnyEndpoints
	case len(clusterEndpoints) == 0:
		return nil, localEndpoints, localEndpoints, hasAnyEndpoints
	}
	all := filterEndpoints(endpoints, func(ep Endpoint) bool { return inCluster(ep) || inLocal(ep) })
	return clusterEndpoints, localEndpoints, all, hasAnyEndpoints
}

// ClusterTopology says which hints CategorizeEndpoints follows for the
// Cluster-policy traffic of a port with these endpoints on the node
// nodeName with labels nodeLabels: v1.ServiceTrafficDistributionPreferSameNode
// when it keeps only the endpoints hinted for this node,
// v1.ServiceTrafficDistributionPreferSameZone when it keeps only those
// hinted for this node's zone, and "" when it ignores hints (no ready
// endpoint, one ready endpoint without a hint of the kind, or none hinted
// for this node or zone). It does not look at the Service: a port that
// never uses Cluster policy follows no hints whatever this returns. It lets
// a caller say why CategorizeEndpoints left out a ready endpoint without
// deciding it a second time.
func ClusterTopology(endpoints []Endpoint, nodeName string, nodeLabels map[string]string) string {
	switch topologyModeFromHints(endpoints, nodeName, nodeLabels[v1.LabelTopologyZone]) {
	case topologySameNode:
		return v1.ServiceTrafficDistributionPreferSameNode
	case topologySameZone:
		return v1.ServiceTrafficDistributionPreferSameZone
	}
	return ""
}

// localServingTerminatingOnly reports whether Local traffic falls back to
// terminating endpoints, in which case they may be missing from the Cluster
// list.
func localServingTerminatingOnly(localReady, localServingTerminating bool) bool {
	return !localReady && localServingTerminating
}

// topologyMode is the topology that Cluster traffic follows.
type topologyMode uint8

const (
	topologyNone topologyMode = iota
	topologySameZone
	topologySameNode
)

func (m topologyMode) allows(ep Endpoint, nodeName, zone string) bool {
	switch m {
	case topologySameNode:
		return ep.NodeHints().Has(nodeName)
	case topologySameZone:
		return ep.ZoneHints().Has(zone)
	default:
		return true
	}
}

// topologyModeFromHints picks the topology from the ready endpoints' hints.
// Hints are all-or-nothing: one ready endpoint without a hint of a kind, or no
// endpoint hinted for this node (zone), disables that kind, so that a
// half-updated slice never concentrates traffic on a few endpoints.
func topologyModeFromHints(endpoints []Endpoint, nodeName, zone string) topologyMode {
	anyReady := false
	allNodeHints, forNode := true, false
	allZoneHints, forZone := true, false
	for _, ep := range endpoints {
		if !ep.IsReady() {
			continue
		}
		anyReady = true
		if nh := ep.NodeHints(); nh.Len() == 0 {
			allNodeHints = false
		} else if nodeName != "" && nh.Has(nodeName) {
			forNode = true
		}
		if zh := ep.ZoneHints(); zh.Len() == 0 {
			allZoneHints = false
		} else if zone != "" && zh.Has(zone) {
			forZone = true
		}
	}
	switch {
	case !anyReady:
		return topologyNone
	case allNodeHints && forNode:
		return topologySameNode
	case allZoneHints && forZone:
		return topologySameZone
	}
	return topologyNone
}

func servingTerminating(ep Endpoint) bool {
	return ep.IsServing() && ep.IsTerminating()
}

// filterEndpoints returns the endpoints that keep accepts, or nil if none.
// When keep accepts all of them, the result is endpoints itself, its
// capacity cut to its length so that an append never writes into the
// caller's array: in the usual port every endpoint is ready, and a copy per
// port and sync is garbage the size of the EndpointsMap.
func filterEndpoints(endpoints []Endpoint, keep func(Endpoint) bool) []Endpoint {
	for i, ep := range endpoints {
		if keep(ep) {
			continue
		}
		// The first endpoint left out: copy those before it, then
		// filter the rest.
		var out []Endpoint
		if i > 0 {
			out = make([]Endpoint, i, len(endpoints)-1)
			copy(out, endpoints[:i])
		}
		for _, ep := range endpoints[i+1:] {
			if keep(ep) {
				if out == nil {
					out = make([]Endpoint, 0, len(endpoints)-i-1)
				}
				out = append(out, ep)
			}
		}
		return out
	}
	if len(endpoints) == 0 {
		return nil
	}
	return endpoints[:len(endpoints):len(endpoints)]
}
