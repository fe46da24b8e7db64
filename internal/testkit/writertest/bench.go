package writertest

import "fmt"

// LoadBench sets on c the cluster of the writers' benchmarks: services
// ClusterIP Services bench/svc-0 … bench/svc-<services-1> of one TCP port,
// Service i at cluster IP 10.96.<i/250>.<i%250+1>, each with one
// EndpointSlice of endpoints ready endpoints, the n-th endpoint of the
// cluster at 10.<128+(n>>16&63)>.<n>>8&255>.<n&255> on node node-<n%100>.
// c must be of family IPv4. Addresses are valid up to 64,000 services and
// repeat beyond 4,194,304 endpoints.
func (c *Cluster) LoadBench(services, endpoints int) {
	n := 0
	eps := make([]Endpoint, 0, endpoints)
	for i := range services {
		name := fmt.Sprintf("svc-%d", i)
		c.SetService(Service("bench", name, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)))
		eps = eps[:0]
		for range endpoints {
			eps = append(eps, Endpoint{IP: fmt.Sprintf("10.%d.%d.%d", 128+n>>16&63, n>>8&255, n&255), Node: fmt.Sprintf("node-%d", n%100)})
			n++
		}
		c.SetEndpoints("bench", name, TCP8080, eps...)
	}
}
