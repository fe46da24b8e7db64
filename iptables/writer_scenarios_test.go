package iptables_test

import (
	"bytes"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/proxy"
)

// The writer's scenarios, shared by the kernel tests (real packets
// through real iptables-restore) and the trace tests (the Fake's packet
// trace), so that the two check the same rules.
//
// Topology: a node with an address on the client's network and a bridge
// for its pods; a client with two addresses; pods on node-a (this node)
// and node-b (modelled: all pods are behind the bridge, but the endpoints
// of pod-b and pod-d say they run on node-b).
const (
	scnNode        = "node-a"
	scnNodeIP      = "10.1.0.1"
	scnClientIP    = "10.1.0.2"
	scnOtherClient = "10.1.0.3"
	scnBridgeIP    = "10.0.0.1"
	scnPodCIDR     = "10.0.0.0/16"
	scnPodA        = "10.0.0.11" // node-a
	scnPodB        = "10.0.0.12" // node-b
	scnPodC        = "10.0.0.13" // node-a
	scnPodD        = "10.0.0.14" // node-b
	scnPort        = 8080
	scnNS          = "demo"
)

// scnPods maps every pod's name, which its backend answers with, to its
// address and node.
var scnPods = []struct{ name, ip, node string }{
	{"pod-a", scnPodA, "node-a"},
	{"pod-b", scnPodB, "node-b"},
	{"pod-c", scnPodC, "node-a"},
	{"pod-d", scnPodD, "node-b"},
}

func scnEP(ip string) ep {
	for _, p := range scnPods {
		if p.ip == ip {
			return ep{IP: ip, Node: p.node}
		}
	}
	panic("no pod " + ip)
}

// The Services of the scenarios; each scenario has its own.
const (
	// web: ClusterIP, TCP and UDP ports (scenario 1); loses pod-b in
	// scenario 6.
	scnWebIP = "10.96.0.10"
	// np: NodePort 30080 and external IP 192.0.2.10 (scenario 2); deleted
	// in scenario 6.
	scnNPIP       = "10.96.0.11"
	scnNodePort   = 30080
	scnExternalIP = "192.0.2.10"
	// lb: load-balancer VIP open to scnClientIP only (scenario 2).
	scnLBIP  = "10.96.0.12"
	scnLBVIP = "203.0.113.5"
	// sticky: ClientIP affinity (scenario 3).
	scnStickyIP = "10.96.0.13"
	// empty: no endpoints, TCP with a node port and UDP (scenario 4).
	scnEmptyIP       = "10.96.0.14"
	scnEmptyNodePort = 30084
	// local: externalTrafficPolicy Local, endpoints on both nodes
	// (scenario 5).
	scnLocalIP       = "10.96.0.15"
	scnLocalNodePort = 30085
	scnLocalHCPort   = 30185
	scnLocalVIP      = "203.0.113.15"
	// remote: externalTrafficPolicy Local, endpoint on node-b only
	// (scenario 5).
	scnRemoteIP       = "10.96.0.16"
	scnRemoteNodePort = 30086
	// hairpin: pod-a's own service.
	scnHairpinIP = "10.96.0.17"
	// added: created in scenario 6, on pod-c.
	scnAddedIP = "10.96.0.20"
	// late: created by the restore that fails in scenario 7, on pod-d.
	scnLateIP = "10.96.0.21"
)

// scnWebPorts are the slice ports of web.
var scnWebPorts = []discoveryv1.EndpointPort{
	slicePort("tcp", scnPort, v1.ProtocolTCP),
	slicePort("udp", scnPort, v1.ProtocolUDP),
}

func scnWriterConfig(randomFully bool) iptables.WriterConfig {
	return iptables.WriterConfig{
		Family:      v1.IPv4Protocol,
		Node:        proxy.NodeConfig{Name: scnNode, ClusterCIDRs: []netip.Prefix{prefix(scnPodCIDR)}},
		RandomFully: randomFully,
	}
}

// scnCluster returns the cluster of the scenarios before any change.
func scnCluster() *cluster {
	c := newCluster(v1.IPv4Protocol, scnNode)
	c.NodeIPs = []netip.Addr{addr(scnNodeIP)}
	ab := []ep{scnEP(scnPodA), scnEP(scnPodB)}

	c.setService(makeService(scnNS, "web", scnWebIP, withPorts(
		v1.ServicePort{Name: "tcp", Port: 80, Protocol: v1.ProtocolTCP},
		v1.ServicePort{Name: "udp", Port: 80, Protocol: v1.ProtocolUDP},
	)))
	c.setEndpoints(scnNS, "web", scnWebPorts, ab...)

	c.setService(makeService(scnNS, "np", scnNPIP, withNodePort(scnNodePort), withExternalIPs(scnExternalIP)))
	c.setEndpoints(scnNS, "np", tcp8080, ab...)

	c.setService(makeService(scnNS, "lb", scnLBIP, withLoadBalancer(scnLBVIP, scnClientIP+"/32")))
	c.setEndpoints(scnNS, "lb", tcp8080, ab...)

	c.setService(makeService(scnNS, "sticky", scnStickyIP, withAffinity(600)))
	c.setEndpoints(scnNS, "sticky", tcp8080, ab...)

	c.setService(makeService(scnNS, "empty", scnEmptyIP, withPorts(
		v1.ServicePort{Name: "tcp", Port: 80, Protocol: v1.ProtocolTCP},
		v1.ServicePort{Name: "udp", Port: 80, Protocol: v1.ProtocolUDP},
	), withNodePort(scnEmptyNodePort)))

	c.setService(makeService(scnNS, "local", scnLocalIP, withLoadBalancer(scnLocalVIP),
		withNodePort(scnLocalNodePort), withExternalLocal(), withHealthCheckNodePort(scnLocalHCPort)))
	c.setEndpoints(scnNS, "local", tcp8080, ab...)

	c.setService(makeService(scnNS, "remote", scnRemoteIP, withNodePort(scnRemoteNodePort), withExternalLocal()))
	c.setEndpoints(scnNS, "remote", tcp8080, scnEP(scnPodB))

	c.setService(makeService(scnNS, "hairpin", scnHairpinIP))
	c.setEndpoints(scnNS, "hairpin", tcp8080, scnEP(scnPodA))
	return c
}

// The changes of scenario 6, each followed by a partial sync.
func scnRemoveEndpoint(c *cluster) {
	c.setEndpoints(scnNS, "web", scnWebPorts, scnEP(scnPodA))
}

func scnAddService(c *cluster) {
	c.setService(makeService(scnNS, "added", scnAddedIP))
	c.setEndpoints(scnNS, "added", tcp8080, scnEP(scnPodC))
}

func scnDeleteService(c *cluster) {
	c.deleteService(scnNS, "np")
	c.deleteEndpoints(scnNS, "np")
}

// scnAddLate is the change whose restore fails in scenario 7.
func scnAddLate(c *cluster) {
	c.setService(makeService(scnNS, "late", scnLateIP))
	c.setEndpoints(scnNS, "late", tcp8080, scnEP(scnPodD))
}

// scnBreak injects a rule iptables-restore rejects (a jump to a chain that
// does not exist) at the start of the nat table of payload.
func scnBreak(payload []byte) []byte {
	rest, ok := bytes.CutPrefix(payload, []byte("*nat\n"))
	if !ok {
		panic("payload does not start with the nat table")
	}
	return append([]byte("*nat\n-A KUBE-SERVICES -j KUBE-NO-SUCH-CHAIN\n"), rest...)
}
