package manifests

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// goodService is a valid Service loaded beside each refused object: a
// refusal must not stop it.
const goodService = `apiVersion: v1
kind: Service
metadata: {name: good, namespace: ns}
spec: {clusterIP: 10.96.0.99, ports: [{port: 80}]}
`

// load writes content to a manifest file and loads it.
func load(t *testing.T, content string) (*Source, []Problem) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	write(t, path, content)
	src, problems, err := New(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	return src, problems
}

// TestRefusedOnCreate checks each rule of the API server's validation that
// the embedded cluster applies: the object is refused with a problem that
// names it and the rule's field, and the other objects of the file load.
func TestRefusedOnCreate(t *testing.T) {
	svc := func(spec string) string {
		return "apiVersion: v1\nkind: Service\nmetadata: {name: bad, namespace: ns}\nspec: " + spec + "\n"
	}
	slice := func(body string) string {
		return "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: bad, namespace: ns, labels: {kubernetes.io/service-name: good}}\n" + body + "\n"
	}
	for _, tc := range []struct {
		name, doc string
		// field is the path the refusal names.
		field string
	}{
		{"healthCheckNodePort on a ClusterIP Service", svc("{clusterIP: 10.96.0.1, ports: [{port: 80}], healthCheckNodePort: 30001}"), "spec.healthCheckNodePort"},
		{"healthCheckNodePort on a LoadBalancer with policy Cluster", svc("{type: LoadBalancer, clusterIP: 10.96.0.1, ports: [{port: 80, nodePort: 30080}], externalTrafficPolicy: Cluster, healthCheckNodePort: 30001}"), "spec.healthCheckNodePort"},
		{"nodePort on a ClusterIP Service", svc("{clusterIP: 10.96.0.1, ports: [{port: 80, nodePort: 30080}]}"), "spec.ports[0].nodePort"},
		{"externalTrafficPolicy on an internal Service", svc("{clusterIP: 10.96.0.1, ports: [{port: 80}], externalTrafficPolicy: Local}"), "spec.externalTrafficPolicy"},
		{"unknown externalTrafficPolicy", svc("{type: NodePort, clusterIP: 10.96.0.1, ports: [{port: 80}], externalTrafficPolicy: Nearby}"), "spec.externalTrafficPolicy"},
		{"unknown internalTrafficPolicy", svc("{clusterIP: 10.96.0.1, ports: [{port: 80}], internalTrafficPolicy: Nearby}"), "spec.internalTrafficPolicy"},
		{"unknown trafficDistribution", svc("{clusterIP: 10.96.0.1, ports: [{port: 80}], trafficDistribution: PreferFar}"), "spec.trafficDistribution"},
		{"unknown type", svc("{type: Magic, clusterIP: 10.96.0.1, ports: [{port: 80}]}"), "spec.type"},
		{"headless NodePort", svc("{type: NodePort, clusterIP: None, ports: [{port: 80}]}"), "spec.clusterIPs[0]"},
		{"ExternalName with a cluster IP", svc("{type: ExternalName, externalName: example.com, clusterIP: 10.96.0.1}"), "spec.clusterIPs"},
		{"clusterIPs not starting with clusterIP", svc("{clusterIP: 10.96.0.1, clusterIPs: [10.96.0.2], ports: [{port: 80}]}"), "spec.clusterIPs"},
		{"two cluster IPs of one family", svc("{clusterIPs: [10.96.0.1, 10.96.0.2], ipFamilyPolicy: RequireDualStack, ports: [{port: 80}]}"), "spec.clusterIPs"},
		{"cluster IP of the other family than ipFamilies", svc("{clusterIPs: [10.96.0.1], ipFamilies: [IPv6], ports: [{port: 80}]}"), "spec.clusterIPs[0]"},
		{"two cluster IPs, single-stack", svc("{clusterIPs: [10.96.0.1, 'fd00::1'], ipFamilyPolicy: SingleStack, ports: [{port: 80}]}"), "spec.ipFamilyPolicy"},
		{"None among cluster IPs", svc("{clusterIPs: [None, 10.96.0.1], ports: [{port: 80}]}"), "spec.clusterIPs"},
		{"no ports", svc("{clusterIP: 10.96.0.1}"), "spec.ports"},
		{"two ports, one unnamed", svc("{clusterIP: 10.96.0.1, ports: [{name: a, port: 80}, {port: 81}]}"), "spec.ports[1].name"},
		{"duplicate port names", svc("{clusterIP: 10.96.0.1, ports: [{name: a, port: 80}, {name: a, port: 81}]}"), "spec.ports[1].name"},
		{"duplicate port and protocol", svc("{clusterIP: 10.96.0.1, ports: [{name: a, port: 80}, {name: b, port: 80, protocol: TCP}]}"), "spec.ports[1]"},
		{"duplicate node port", svc("{type: NodePort, clusterIP: 10.96.0.1, ports: [{name: a, port: 80, nodePort: 30080}, {name: b, port: 81, nodePort: 30080}]}"), "spec.ports[1].nodePort"},
		{"sessionAffinityConfig without ClientIP affinity", svc("{clusterIP: 10.96.0.1, ports: [{port: 80}], sessionAffinityConfig: {clientIP: {timeoutSeconds: 10}}}"), "spec.sessionAffinityConfig"},
		{"source ranges on a NodePort Service", svc("{type: NodePort, clusterIP: 10.96.0.1, ports: [{port: 80}], loadBalancerSourceRanges: [10.0.0.0/8]}"), "spec.loadBalancerSourceRanges"},
		{"load-balancer status on a NodePort Service", svc("{type: NodePort, clusterIP: 10.96.0.1, ports: [{port: 80}]}\nstatus: {loadBalancer: {ingress: [{ip: 192.0.2.1}]}}"), "status.loadBalancer.ingress"},
		{"ipMode without ip", svc("{type: LoadBalancer, clusterIP: 10.96.0.1, ports: [{port: 80}]}\nstatus: {loadBalancer: {ingress: [{hostname: lb.example, ipMode: VIP}]}}"), "status.loadBalancer.ingress[0].ipMode"},
		{"unknown ipMode", svc("{type: LoadBalancer, clusterIP: 10.96.0.1, ports: [{port: 80}]}\nstatus: {loadBalancer: {ingress: [{ip: 192.0.2.1, ipMode: Tunnel}]}}"), "status.loadBalancer.ingress[0].ipMode"},
		{"label value not a label value", "apiVersion: v1\nkind: Service\nmetadata: {name: bad, namespace: ns, labels: {service.kubernetes.io/service-proxy-name: 'a b'}}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}", "metadata.labels"},
		{"slice without addressType", slice("endpoints: [{addresses: [10.0.0.1]}]"), "addressType"},
		{"IPv6 address in an IPv4 slice", slice("addressType: IPv4\nendpoints: [{addresses: ['fd00::1']}]"), "endpoints[0].addresses[0]"},
		{"endpoint without an address", slice("addressType: IPv4\nendpoints: [{addresses: []}]"), "endpoints[0].addresses"},
		{"duplicate slice port names", slice("addressType: IPv4\nports: [{name: a, port: 80, protocol: TCP}, {name: a, port: 80, protocol: UDP}]"), "ports[1].name"},
		{"bad endpoint node name", slice("addressType: IPv4\nendpoints: [{addresses: [10.0.0.1], nodeName: Node_A}]"), "endpoints[0].nodeName"},
		{"too many zone hints", slice("addressType: IPv4\nendpoints: [{addresses: [10.0.0.1], hints: {forZones: [{name: a}, {name: b}, {name: c}, {name: d}, {name: e}, {name: f}, {name: g}, {name: h}, {name: i}]}}]"), "endpoints[0].hints.forZones"},
		{"node with a bad name", "apiVersion: v1\nkind: Node\nmetadata: {name: Node_A}", "metadata.name"},
		{"node with two IPv4 pod CIDRs", "apiVersion: v1\nkind: Node\nmetadata: {name: node-a}\nspec: {podCIDRs: [10.0.0.0/24, 10.0.1.0/24]}", "spec.podCIDRs"},
		{"service name with a line break", "apiVersion: v1\nkind: Service\nmetadata: {name: \"a\\nb\", namespace: ns}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}", "metadata.name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, problems := load(t, goodService+"---\n"+tc.doc)
			if len(problems) != 1 {
				t.Fatalf("problems = %v, want one refusal", problems)
			}
			p := problems[0]
			if p.Kind == "" || p.Namespace+p.Name == "" || p.Document != 2 {
				t.Errorf("problem %+v does not name the refused object and its document", p)
			}
			if msg := p.Err.Error(); !strings.Contains(msg, tc.field+":") || !strings.Contains(msg, "is invalid") {
				t.Errorf("refusal %q does not name the field %s", msg, tc.field)
			}
			if diff := cmp.Diff([]string{"Service ns/good"}, names(t, src.Client())); diff != "" {
				t.Errorf("objects (-want +got):\n%s", diff)
			}
		})
	}
}

// TestAcceptedBeforeDefaulting checks that fields the API server would
// default or allocate are not refused when a manifest leaves them out.
func TestAcceptedBeforeDefaulting(t *testing.T) {
	const docs = `apiVersion: v1
kind: Service
metadata: {name: lb, namespace: ns}
spec:
  type: LoadBalancer
  clusterIPs: [10.96.0.1, "fd00::1"]
  ipFamilyPolicy: PreferDualStack
  externalTrafficPolicy: Local
  loadBalancerSourceRanges: [" 10.0.0.0/8 "]
  ports: [{name: a, port: 80, nodePort: 30080}, {name: b, port: 80, protocol: UDP, nodePort: 30080}]
status: {loadBalancer: {ingress: [{ip: 192.0.2.1, ipMode: Proxy}]}}
---
apiVersion: v1
kind: Service
metadata: {name: headless, namespace: ns}
spec: {clusterIP: None}
---
apiVersion: v1
kind: Service
metadata: {name: ext, namespace: ns}
spec: {type: ExternalName, externalName: example.com}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: lb-1, namespace: ns, labels: {kubernetes.io/service-name: lb}}
addressType: IPv6
endpoints: [{addresses: ["fd00::5"], nodeName: node-a, hints: {forNodes: [{name: node-a}]}}]
ports: [{name: a, port: 8080}, {name: b, port: 8080, protocol: UDP}]
`
	src, problems := load(t, docs)
	if len(problems) != 0 {
		t.Errorf("problems = %v, want none", problems)
	}
	want := []string{"EndpointSlice ns/lb-1", "Service ns/ext", "Service ns/headless", "Service ns/lb"}
	if diff := cmp.Diff(want, sorted(names(t, src.Client()))); diff != "" {
		t.Errorf("objects (-want +got):\n%s", diff)
	}
}

// TestRefusedOnUpdate checks the rules of an update: a refused change
// leaves the object as it was, with a problem naming it, and sends no
// event.
func TestRefusedOnUpdate(t *testing.T) {
	const lb = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  externalTrafficPolicy: Local
  healthCheckNodePort: 30001
  ports: [{port: 80, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-abc, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [10.0.1.5]}]
`
	for _, tc := range []struct {
		name, from, to, field string
	}{
		{"cluster IP", "clusterIP: 10.96.0.10", "clusterIP: 10.96.0.11", "spec.clusterIPs[0]"},
		{"health-check node port", "healthCheckNodePort: 30001", "healthCheckNodePort: 30002", "spec.healthCheckNodePort"},
		{"address type", "addressType: IPv4\nendpoints: [{addresses: [10.0.1.5]}]", "addressType: IPv6\nendpoints: [{addresses: ['fd00::5']}]", "addressType"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "cluster.yaml")
			write(t, path, lb)
			ctx := context.Background()
			src, problems, err := New(ctx, path)
			if err != nil || len(problems) != 0 {
				t.Fatalf("New: %v %v", problems, err)
			}
			events := recordEvents(t, src.Client(), 2)
			edited := strings.Replace(lb, tc.from, tc.to, 1)
			if edited == lb {
				t.Fatalf("%q is not in the manifest", tc.from)
			}
			write(t, path, edited)
			problems, err = src.Reload(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(problems) != 1 || !strings.Contains(problems[0].Err.Error(), tc.field+":") {
				t.Fatalf("problems = %v, want the refusal of %s", problems, tc.field)
			}
			if got := events(); len(got) != 0 {
				t.Errorf("a refused update sent events: %v", got)
			}
			svc, err := src.Client().CoreV1().Services("shop").Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if svc.Spec.ClusterIP != "10.96.0.10" || svc.Spec.HealthCheckNodePort != 30001 {
				t.Errorf("the Service changed: %+v", svc.Spec)
			}
		})
	}
}
