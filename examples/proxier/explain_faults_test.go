package main

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/explain"
)

// explainFaults are seven common reasons a Service does not answer, and a
// healthy Service, in namespace e2e on node-a (zone-a): before explain,
// the first five looked the same on a node (a "has no endpoints" REJECT).
const explainFaults = `apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-a}}
status: {addresses: [{type: InternalIP, address: ` + e2eNodeIP + `}]}
---
apiVersion: v1
kind: Service
metadata: {name: healthy, namespace: e2e}
spec: {selector: {app: healthy}, clusterIP: 10.96.0.20, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: healthy-1, namespace: e2e, labels: {kubernetes.io/service-name: healthy}}
addressType: IPv4
endpoints: [{addresses: [10.244.0.11], nodeName: node-a, conditions: {ready: true}}]
ports: [{name: http, port: 8080, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: notready, namespace: e2e}
spec: {selector: {app: notready}, clusterIP: 10.96.0.21, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: notready-1, namespace: e2e, labels: {kubernetes.io/service-name: notready}}
addressType: IPv4
endpoints: [{addresses: [10.244.0.11], nodeName: node-a, conditions: {ready: false, serving: false, terminating: false}}]
ports: [{name: http, port: 8080, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: portname, namespace: e2e}
spec: {selector: {app: portname}, clusterIP: 10.96.0.22, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: portname-1, namespace: e2e, labels: {kubernetes.io/service-name: portname}}
addressType: IPv4
endpoints: [{addresses: [10.244.0.11], nodeName: node-a, conditions: {ready: true}}]
ports: [{name: web, port: 8080, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: unlabelled, namespace: e2e}
spec: {clusterIP: 10.96.0.23, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: unlabelled-manual, namespace: e2e}
addressType: IPv4
endpoints: [{addresses: [10.244.0.11], nodeName: node-a, conditions: {ready: true}}]
ports: [{name: http, port: 8080, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: other, namespace: e2e, labels: {service.kubernetes.io/service-proxy-name: another-proxy}}
spec: {selector: {app: other}, clusterIP: 10.96.0.24, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: other-1, namespace: e2e, labels: {kubernetes.io/service-name: other}}
addressType: IPv4
endpoints: [{addresses: [10.244.0.11], nodeName: node-a, conditions: {ready: true}}]
ports: [{name: http, port: 8080, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: terminating, namespace: e2e}
spec: {selector: {app: terminating}, clusterIP: 10.96.0.25, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: terminating-1, namespace: e2e, labels: {kubernetes.io/service-name: terminating}}
addressType: IPv4
endpoints: [{addresses: [10.244.0.11], nodeName: node-a, conditions: {ready: false, serving: false, terminating: true}}]
ports: [{name: http, port: 8080, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: elsewhere, namespace: e2e}
spec: {type: NodePort, externalTrafficPolicy: Local, selector: {app: elsewhere}, clusterIP: 10.96.0.26, ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30086}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: elsewhere-1, namespace: e2e, labels: {kubernetes.io/service-name: elsewhere}}
addressType: IPv4
endpoints: [{addresses: [10.244.0.12], nodeName: node-b, conditions: {ready: true}}]
ports: [{name: http, port: 8080, protocol: TCP}]
---
apiVersion: v1
kind: Service
metadata: {name: zoned, namespace: e2e, annotations: {service.kubernetes.io/topology-mode: Auto}}
spec: {selector: {app: zoned}, clusterIP: 10.96.0.27, ports: [{name: http, port: 80, targetPort: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: zoned-1, namespace: e2e, labels: {kubernetes.io/service-name: zoned}}
addressType: IPv4
endpoints:
- {addresses: [10.244.0.11], nodeName: node-a, zone: zone-a, conditions: {ready: true}, hints: {forZones: [{name: zone-a}]}}
- {addresses: [10.244.0.12], nodeName: node-b, zone: zone-b, conditions: {ready: true}, hints: {forZones: [{name: zone-b}]}}
ports: [{name: http, port: 8080, protocol: TCP}]
`

// TestExplainFaultsE2E programs the seven faults with the proxier in
// each mode, in a namespace, and checks that explain service names each
// cause, and that the traced ways in agree with the rules: the proxier
// rejects what has no endpoints, drops what has no local one under a
// Local policy, leaves another proxy's Service alone, and follows the
// topology hints.
func TestExplainFaultsE2E(t *testing.T) {
	forEachE2EMode(t, false, func(t *testing.T, m e2eMode) {
		k := newE2EModeNode(t, m, &e2eCluster{node: explainFaults}, false)
		common := []string{"--mode", m.mode, "--manifests", k.dir, "--hostname-override", "node-a", "--cluster-cidr", e2eClusterCIDR}
		if err := k.runProxier(append([]string{"--once"}, common...)...); err != nil {
			t.Fatalf("--once: %v\n%s", err, k.log.String())
		}
		explainArgs := append(common, "--netns", "/run/netns/"+k.node.Name)
		for _, tc := range []struct {
			service string
			// reasons are each endpoint's "address internal/external",
			// with "used" for a used one and "-" for no external verdict.
			reasons []string
			// notProxied says the Service is left to another proxy.
			notProxied bool
			// way is the way traced ("Kind from source") and what it
			// ends in: the endpoints it is DNATed to, or the verdict.
			way  string
			ends []string
		}{
			{"healthy", []string{"10.244.0.11 used/-"}, false, "ClusterIP from pod", []string{"10.244.0.11:8080"}},
			{"notready", []string{"10.244.0.11 NotReady/-"}, false, "ClusterIP from pod", []string{"REJECT"}},
			{"portname", []string{"10.244.0.11 PortNameMismatch/-"}, false, "ClusterIP from pod", []string{"REJECT"}},
			{"unlabelled", []string{"10.244.0.11 SliceWithoutServiceName/-"}, false, "ClusterIP from pod", []string{"REJECT"}},
			{"other", []string{"10.244.0.11 ServiceNotProxied/-"}, true, "", nil},
			{"terminating", []string{"10.244.0.11 TerminatingNotServing/-"}, false, "ClusterIP from pod", []string{"REJECT"}},
			{"elsewhere", []string{"10.244.0.12 used/NotLocal"}, false, "NodePort from outside", []string{"DROP"}},
			{"zoned", []string{"10.244.0.11 used/-", "10.244.0.12 TopologyHints/-"}, false, "ClusterIP from pod", []string{"10.244.0.11:8080"}},
		} {
			t.Run(tc.service, func(t *testing.T) {
				var stdout, stderr bytes.Buffer
				args := append(append([]string{"service", e2eNS + "/" + tc.service}, explainArgs...), "-o", "json")
				if status := explainMain(testLogger(&logBuffer{}, 0), args, realEnvironment(&stdout), &stderr); status != 0 {
					t.Fatalf("status %d: %s", status, stderr.String())
				}
				var r explain.ServiceReport
				if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
					t.Fatalf("%v:\n%s", err, stdout.String())
				}
				var reasons []string
				ends := map[string][]string{}
				for _, p := range r.Ports {
					for _, e := range p.Endpoints {
						reasons = append(reasons, e.Address+" "+verdictWord(e.Internal)+"/"+externalWord(e.External))
					}
					for _, wi := range p.WaysIn {
						for _, tr := range wi.Traces {
							key := wi.Kind + " from " + string(tr.From.Kind)
							if tr.Error != "" || tr.Differs {
								t.Errorf("%s: error %q, differs %t", key, tr.Error, tr.Differs)
							}
							for _, o := range tr.Outcomes {
								end := string(o.Verdict)
								if o.Endpoint.IsValid() {
									end = o.Endpoint.String()
								}
								ends[key] = append(ends[key], end)
							}
						}
					}
				}
				if diff := cmp.Diff(tc.reasons, reasons); diff != "" {
					t.Errorf("endpoints (-want +got):\n%s\n%s", diff, stdout.String())
				}
				if got := len(r.NotProxied) > 0; got != tc.notProxied {
					t.Errorf("not proxied: %q", r.NotProxied)
				}
				if tc.way != "" {
					if diff := cmp.Diff(tc.ends, ends[tc.way]); diff != "" {
						t.Errorf("%s ends (-want +got):\n%s\n%s", tc.way, diff, stdout.String())
					}
				}
			})
		}
		// Another proxy's Service: nothing of this proxier touches it.
		var stdout, stderr bytes.Buffer
		args := append(append([]string{"packet", "10.96.0.24:80/tcp", "--from", "pod"}, explainArgs...), "-o", "json")
		if status := explainMain(testLogger(&logBuffer{}, 0), args, realEnvironment(&stdout), &stderr); status != 0 {
			t.Fatalf("packet to another proxy's Service: status %d: %s", status, stderr.String())
		}
		var ex explain.Explanation
		if err := json.Unmarshal(stdout.Bytes(), &ex); err != nil || len(ex.Outcomes) != 1 || ex.Outcomes[0].Verdict != explain.Accept || ex.Outcomes[0].Endpoint.IsValid() {
			t.Errorf("packet to another proxy's Service: %v\n%s", err, stdout.String())
		}
	})
}

func verdictWord(v explain.EndpointVerdict) string {
	if v.Used {
		return "used"
	}
	return string(v.Reason)
}

func externalWord(v *explain.EndpointVerdict) string {
	if v == nil {
		return "-"
	}
	return verdictWord(*v)
}
