package writertest

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/proxykit/proxykit/changetracker"
)

// TestClusterRoundTrip checks that what a Cluster is given reaches its
// maps on Update, for either family, and that deleting it empties them.
func TestClusterRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		family    v1.IPFamily
		clusterIP string
		eps       []Endpoint
		want      []string
	}{
		{v1.IPv4Protocol, "10.96.0.1", []Endpoint{{IP: "10.0.0.1", Node: Node}, {IP: "10.0.0.2", NotReady: true}}, []string{"10.0.0.1:8080", "10.0.0.2:8080"}},
		{v1.IPv6Protocol, "fd00::1", []Endpoint{{IP: "fd00:10::1", Terminating: true}}, []string{"[fd00:10::1]:8080"}},
	} {
		t.Run(string(tc.family), func(t *testing.T) {
			c := NewCluster(tc.family, Node)
			c.SetService(Service("ns", "web", tc.clusterIP))
			c.SetEndpoints("ns", "web", TCP8080, tc.eps...)
			c.Update()
			if len(c.ServiceMap) != 1 {
				t.Fatalf("service map holds %d ports, want 1", len(c.ServiceMap))
			}
			var got []string
			for _, eps := range c.EndpointsMap {
				for _, e := range eps {
					got = append(got, e.String())
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("endpoints (-want +got):\n%s", diff)
			}
			c.DeleteEndpoints("ns", "other") // none: nothing happens
			c.DeleteEndpoints("ns", "web")
			c.DeleteService("ns", "web")
			c.Update()
			if len(c.ServiceMap) != 0 || len(c.EndpointsMap) != 0 || len(c.Services) != 0 || len(c.Slices) != 0 {
				t.Errorf("after the deletions: %d ports, %d endpoint lists, %d services, %d slices; want none",
					len(c.ServiceMap), len(c.EndpointsMap), len(c.Services), len(c.Slices))
			}
		})
	}
}

// TestLoadBench checks the benchmark cluster's size and addresses.
func TestLoadBench(t *testing.T) {
	c := NewCluster(v1.IPv4Protocol, "node-1")
	c.LoadBench(300, 3)
	c.Update()
	if len(c.ServiceMap) != 300 || len(c.Slices) != 300 {
		t.Fatalf("%d ports, %d slices; want 300 each", len(c.ServiceMap), len(c.Slices))
	}
	if got := c.Services["bench/svc-299"].Spec.ClusterIP; got != "10.96.1.50" {
		t.Errorf("cluster IP of svc-299 = %s, want 10.96.1.50", got)
	}
	last := c.Slices["bench/svc-299-1"].Endpoints[2]
	if diff := cmp.Diff([]string{"10.128.3.131"}, last.Addresses); diff != "" || *last.NodeName != "node-99" {
		t.Errorf("last endpoint: %v on %s; want 10.128.3.131 on node-99", last.Addresses, *last.NodeName)
	}
}

// TestMarkChanged checks that a port marked by hand joins its Service's
// ports in the result, sorted and once, without changing the slice
// Update made, and that a result without Ports keeps none.
func TestMarkChanged(t *testing.T) {
	c := NewCluster(v1.IPv4Protocol, Node)
	c.SetService(Service("ns", "web", "10.96.0.1"))
	res, _ := c.Update()
	nn := types.NamespacedName{Namespace: "ns", Name: "web"}
	before := res.Ports[nn]
	orig := slices.Clone(before)
	extra := changetracker.ServicePortName{NamespacedName: nn, Port: "a", Protocol: v1.ProtocolUDP}
	other := changetracker.ServicePortName{NamespacedName: types.NamespacedName{Namespace: "bad", Name: "x"}, Port: "p", Protocol: v1.ProtocolTCP}
	MarkChanged(&res, extra)
	MarkChanged(&res, extra)
	MarkChanged(&res, other)
	want := map[types.NamespacedName][]changetracker.ServicePortName{
		nn:                   {extra, before[0]},
		other.NamespacedName: {other},
	}
	if diff := cmp.Diff(want, res.Ports); diff != "" {
		t.Errorf("Ports (-want +got):\n%s", diff)
	}
	if !res.UpdatedServices.Has(nn) || !res.UpdatedServices.Has(other.NamespacedName) {
		t.Errorf("UpdatedServices = %v, want both Services", res.UpdatedServices)
	}
	if diff := cmp.Diff(orig, before); diff != "" {
		t.Errorf("the slice Update made changed (-was +is):\n%s", diff)
	}
	byHand := changetracker.UpdateServiceMapResult{UpdatedServices: sets.New[types.NamespacedName]()}
	MarkChanged(&byHand, other)
	if byHand.Ports != nil || !byHand.UpdatedServices.Has(other.NamespacedName) {
		t.Errorf("a result without Ports: %+v, want the Service updated and no Ports", byHand)
	}
}
