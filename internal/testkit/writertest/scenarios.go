package writertest

import (
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Node is the node from which the Scenarios' clusters are seen.
const Node = "node-a"

// Scenario is one small cluster that shows one behaviour of a service
// proxy. Each writer's golden test renders every Scenario with its own
// configuration and compares the result with its own golden file, named
// after the Scenario.
type Scenario struct {
	Name string
	// Setup sets the Services, endpoints and node labels on an empty
	// IPv4 Cluster seen from Node.
	Setup func(c *Cluster)
}

func local(ip string) Endpoint  { return Endpoint{IP: ip, Node: Node} }
func remote(ip string) Endpoint { return Endpoint{IP: ip, Node: "node-b"} }

// Scenarios are the clusters that the iptables and nftables writers'
// golden tests share; a behaviour that only one writer has, or that needs
// a writer's own configuration, stays in that writer's test.
var Scenarios = []Scenario{{
	Name: "cluster-ip",
	Setup: func(c *Cluster) {
		c.SetService(Service("ns", "web", "10.96.0.10"))
		c.SetEndpoints("ns", "web", TCP8080, local("10.0.1.1"), remote("10.0.2.1"), remote("10.0.2.2"))
	},
}, {
	Name: "node-port-external-ip",
	Setup: func(c *Cluster) {
		c.SetService(Service("ns", "web", "10.96.0.10", WithNodePort(30080), WithExternalIPs("192.0.2.10", "fd00::10")))
		c.SetEndpoints("ns", "web", TCP8080, local("10.0.1.1"), remote("10.0.2.1"))
	},
}, {
	Name: "load-balancer-local-policy",
	Setup: func(c *Cluster) {
		c.SetService(Service("ns", "lb", "10.96.0.11",
			WithLoadBalancer("203.0.113.5", "198.51.100.0/24", "192.168.0.0/24"), WithNodePort(31000),
			WithExternalLocal(), WithHealthCheckNodePort(32000)))
		c.SetEndpoints("ns", "lb", TCP8080, local("10.0.1.1"), remote("10.0.2.1"))
	},
}, {
	Name: "external-local-no-local-endpoints",
	Setup: func(c *Cluster) {
		c.SetService(Service("ns", "lb", "10.96.0.11", WithLoadBalancer("203.0.113.5"), WithNodePort(31000),
			WithExternalIPs("192.0.2.11"), WithExternalLocal(), WithHealthCheckNodePort(32000)))
		c.SetEndpoints("ns", "lb", TCP8080, remote("10.0.2.1"))
	},
}, {
	Name: "internal-local",
	Setup: func(c *Cluster) {
		c.SetService(Service("ns", "with-local", "10.96.0.12", WithInternalLocal()))
		c.SetEndpoints("ns", "with-local", TCP8080, local("10.0.1.1"), remote("10.0.2.1"))
		c.SetService(Service("ns", "without-local", "10.96.0.13", WithInternalLocal()))
		c.SetEndpoints("ns", "without-local", TCP8080, remote("10.0.2.2"))
	},
}, {
	Name: "no-endpoints",
	Setup: func(c *Cluster) {
		c.SetService(Service("ns", "empty", "10.96.0.15", WithLoadBalancer("203.0.113.6", "198.51.100.0/24"),
			WithNodePort(30090), WithExternalIPs("192.0.2.15")))
		// Endpoints that are not ready and not terminating do not count.
		c.SetEndpoints("ns", "empty", TCP8080, Endpoint{IP: "10.0.1.1", Node: Node, NotReady: true})
	},
}, {
	Name: "terminating-fallback",
	Setup: func(c *Cluster) {
		c.SetService(Service("ns", "rollout", "10.96.0.16"))
		c.SetEndpoints("ns", "rollout", TCP8080, Endpoint{IP: "10.0.1.1", Node: Node, Terminating: true}, Endpoint{IP: "10.0.1.2", Node: Node, NotReady: true})
	},
}, {
	Name: "topology",
	Setup: func(c *Cluster) {
		c.NodeLabels = map[string]string{v1.LabelTopologyZone: "zone-a"}
		c.SetService(Service("ns", "zoned", "10.96.0.17"))
		c.SetEndpoints("ns", "zoned", TCP8080,
			Endpoint{IP: "10.0.1.1", Node: Node, ZoneHints: []string{"zone-a"}},
			Endpoint{IP: "10.0.2.1", Node: "node-b", ZoneHints: []string{"zone-b"}},
			Endpoint{IP: "10.0.3.1", Node: "node-c", ZoneHints: []string{"zone-a"}})
	},
}, {
	Name: "udp-sctp",
	Setup: func(c *Cluster) {
		c.SetService(Service("ns", "dns", "10.96.0.18", WithPorts(
			v1.ServicePort{Name: "dns", Port: 53, Protocol: v1.ProtocolUDP},
			v1.ServicePort{Name: "sctp", Port: 9999, Protocol: v1.ProtocolSCTP},
		)))
		c.SetEndpoints("ns", "dns", []discoveryv1.EndpointPort{
			SlicePort("dns", 5353, v1.ProtocolUDP),
			SlicePort("sctp", 9999, v1.ProtocolSCTP),
		}, local("10.0.1.1"))
	},
}}
