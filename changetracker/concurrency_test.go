package changetracker

import (
	"fmt"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// TestConcurrentUpdates runs informer-style writers against a sync-style
// reader; run it with -race. Whatever the interleaving, the maps must end in
// the state of the last events.
func TestConcurrentUpdates(t *testing.T) {
	const writers, services, rounds = 4, 25, 20
	svcTracker := NewServiceChangeTracker(v1.IPv4Protocol, nil)
	epTracker := NewEndpointsChangeTracker(v1.IPv4Protocol, "node-a", nil)
	svcMap, epMap := ServicePortMap{}, EndpointsMap{}

	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var prev []*v1.Service
			for r := range rounds {
				for s := range services {
					name := fmt.Sprintf("w%d-s%d", w, s)
					svc := makeService("ns", name, withClusterIPs(fmt.Sprintf("10.%d.%d.1", w, s)))
					if r%2 == 1 {
						svc.Spec.Ports[0].Port = 81
					}
					var old *v1.Service
					if r > 0 {
						old = prev[s]
					} else {
						prev = append(prev, nil)
					}
					svcTracker.Update(old, svc)
					prev[s] = svc
					slice := makeSlice("ns", name, name+"-1", discoveryv1.AddressTypeIPv4,
						[]port{namedPort("http", 8080, v1.ProtocolTCP)},
						readyEP(fmt.Sprintf("10.%d.%d.%d", 100+w, s, r+1), "node-a"))
					epTracker.EndpointSliceUpdate(slice, false)
				}
			}
		}()
	}
	done := make(chan struct{})
	var readerWG sync.WaitGroup
	readerWG.Add(1)
	go func() {
		defer readerWG.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			svcMap.Update(svcTracker)
			epMap.Update(epTracker)
			for name, svc := range svcMap {
				CategorizeEndpoints(epMap[name], svc, "node-a", nil)
			}
		}
	}()
	wg.Wait()
	close(done)
	readerWG.Wait()
	svcMap.Update(svcTracker)
	epMap.Update(epTracker)

	wantSvc := map[string]string{}
	wantEP := map[string][]string{}
	for w := range writers {
		for s := range services {
			key := fmt.Sprintf("ns/w%d-s%d:http/TCP", w, s)
			wantSvc[key] = fmt.Sprintf("10.%d.%d.1:81/TCP", w, s)
			wantEP[key] = []string{fmt.Sprintf("10.%d.%d.%d:8080 local ready serving node=node-a", 100+w, s, rounds)}
		}
	}
	if diff := cmp.Diff(wantSvc, describeServicePortMap(svcMap)); diff != "" {
		t.Errorf("service map (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantEP, describeEndpointsMap(epMap)); diff != "" {
		t.Errorf("endpoints map (-want +got):\n%s", diff)
	}
}
