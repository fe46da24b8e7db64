package healthz

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
)

var (
	svcA = types.NamespacedName{Namespace: "default", Name: "a"}
	svcB = types.NamespacedName{Namespace: "default", Name: "b"}
	svcC = types.NamespacedName{Namespace: "kube-system", Name: "c"}
)

// staticHealth is a HealthReporter with a fixed answer.
type staticHealth bool

func (h staticHealth) Health() ProxyHealth { return ProxyHealth{Healthy: bool(h)} }

// check GETs a health-check port through mem and returns the status and
// body.
func check(t *testing.T, mem *memNet, addr string) (int, map[string]any) {
	t.Helper()
	resp, err := mem.Client().Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("GET %s: %v", addr, err)
	}
	if w := resp.Header.Get("X-Load-Balancing-Endpoint-Weight"); w == "" {
		t.Errorf("GET %s: no X-Load-Balancing-Endpoint-Weight header", addr)
	}
	return decode(t, resp)
}

func serviceBody(name types.NamespacedName, endpoints int, healthy bool) map[string]any {
	return map[string]any{
		"service":             map[string]any{"namespace": name.Namespace, "name": name.Name},
		"localEndpoints":      float64(endpoints),
		"serviceProxyHealthy": healthy,
	}
}

// bindErrors returns the Services and ports of the *BindErrors joined in
// err, as "namespace/name:port", sorted; it fails the test on an error of
// another type, and on one that does not name its Service.
func bindErrors(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	var got []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var be *BindError
		if !errors.As(e, &be) {
			t.Fatalf("error %v is not a *BindError", e)
		}
		if !strings.Contains(be.Error(), be.Service.String()) {
			t.Errorf("error %q does not name the service", be)
		}
		got = append(got, fmt.Sprintf("%s:%d", be.Service, be.Port))
	}
	slices.Sort(got)
	return got
}

func TestServiceHealthResponses(t *testing.T) {
	for _, tc := range []struct {
		name      string
		proxy     HealthReporter
		endpoints map[types.NamespacedName]int
		wantCode  int
		wantBody  map[string]any
	}{
		{"local endpoints, proxy healthy", staticHealth(true), map[types.NamespacedName]int{svcA: 3}, 200, serviceBody(svcA, 3, true)},
		{"local endpoints, proxy unhealthy", staticHealth(false), map[types.NamespacedName]int{svcA: 3}, 503, serviceBody(svcA, 3, false)},
		{"no local endpoints", staticHealth(true), map[types.NamespacedName]int{svcB: 1}, 503, serviceBody(svcA, 0, true)},
		{"zero local endpoints", staticHealth(true), map[types.NamespacedName]int{svcA: 0}, 503, serviceBody(svcA, 0, true)},
		{"nil proxy counts as healthy", nil, map[types.NamespacedName]int{svcA: 1}, 200, serviceBody(svcA, 1, true)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			mem := newMemNet()
			s := NewServiceHealthServer("node-1", tc.proxy, WithListenFunc(mem.Listen))
			defer s.Close()
			// Endpoints first: the order of the two calls must not matter.
			s.SyncEndpoints(tc.endpoints)
			if err := s.SyncServices(ctx, map[types.NamespacedName]uint16{svcA: 30001}); err != nil {
				t.Fatal(err)
			}
			code, body := check(t, mem, ":30001")
			if code != tc.wantCode {
				t.Errorf("status %d, want %d", code, tc.wantCode)
			}
			if diff := cmp.Diff(tc.wantBody, body); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
		})
	}
}

func TestServiceHealthOpenClose(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	mem := newMemNet()
	s := NewServiceHealthServer("node-1", staticHealth(true), WithListenFunc(mem.Listen))
	defer s.Close()

	type ports = map[types.NamespacedName]uint16
	sync := func(p ports) {
		t.Helper()
		if err := s.SyncServices(ctx, p); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(p, s.Ports()); diff != "" {
			t.Errorf("Ports() (-want +got):\n%s", diff)
		}
	}

	sync(ports{svcA: 30001, svcB: 30002})
	before := mem.open()
	if diff := cmp.Diff([]string{":30001", ":30002"}, slices.Sorted(maps.Keys(before))); diff != "" {
		t.Errorf("listeners after first sync (-want +got):\n%s", diff)
	}

	// B goes, C comes, A's port is untouched: its listener must be the
	// same one, never closed.
	sync(ports{svcA: 30001, svcC: 30003})
	after := mem.open()
	if after[":30001"] != before[":30001"] {
		t.Errorf("A's listener was reopened: #%d, then #%d", before[":30001"], after[":30001"])
	}
	if _, ok := after[":30002"]; ok {
		t.Error("B's port is still open after B went away")
	}
	if _, ok := after[":30003"]; !ok {
		t.Error("C's port was not opened")
	}
	if _, err := mem.Client().Get("http://:30002/"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("GET on B's closed port: %v, want connection refused", err)
	}

	// A's port changes: the old one closes, the new one opens.
	s.SyncEndpoints(map[types.NamespacedName]int{svcA: 2})
	sync(ports{svcA: 31001, svcC: 30003})
	after = mem.open()
	if _, ok := after[":30001"]; ok {
		t.Error("A's old port is still open")
	}
	if code, body := check(t, mem, ":31001"); code != 200 || body["localEndpoints"] != float64(2) {
		t.Errorf("A on its new port: %d %v", code, body)
	}

	sync(ports{})
	if open := mem.open(); len(open) != 0 {
		t.Errorf("listeners left after syncing no services: %v", open)
	}
}

func TestServiceHealthBindErrors(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	mem := newMemNet()
	mem.fail[":30002"] = syscall.EADDRINUSE
	s := NewServiceHealthServer("node-1", staticHealth(true), WithListenFunc(mem.Listen))
	defer s.Close()
	s.SyncEndpoints(map[types.NamespacedName]int{svcA: 1, svcB: 1, svcC: 1})

	want := map[types.NamespacedName]uint16{svcA: 30001, svcB: 30002, svcC: 0}
	err := s.SyncServices(ctx, want)
	if diff := cmp.Diff([]string{"default/b:30002", "kube-system/c:0"}, bindErrors(t, err)); diff != "" {
		t.Errorf("bind errors (-want +got):\n%s", diff)
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("joined error %v does not wrap EADDRINUSE", err)
	}
	// The others are served.
	if code, _ := check(t, mem, ":30001"); code != 200 {
		t.Errorf("A: %d, want 200", code)
	}
	if diff := cmp.Diff(map[types.NamespacedName]uint16{svcA: 30001}, s.Ports()); diff != "" {
		t.Errorf("Ports() (-want +got):\n%s", diff)
	}

	// The port frees up: the next sync opens it without touching A.
	delete(mem.fail, ":30002")
	before := mem.open()[":30001"]
	delete(want, svcC)
	if err := s.SyncServices(ctx, want); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if code, _ := check(t, mem, ":30002"); code != 200 {
		t.Errorf("B after retry: %d, want 200", code)
	}
	if mem.open()[":30001"] != before {
		t.Error("A's listener was reopened by the retry")
	}
}

func TestServiceHealthNodeAddresses(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	mem := newMemNet()
	s := NewServiceHealthServer("node-1", staticHealth(true), WithListenFunc(mem.Listen),
		WithNodeAddresses(netip.MustParseAddr("10.0.0.1"), netip.Addr{}, netip.MustParseAddr("fd00::1")))
	defer s.Close()
	s.SyncEndpoints(map[types.NamespacedName]int{svcA: 1})
	if err := s.SyncServices(ctx, map[types.NamespacedName]uint16{svcA: 30001}); err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"10.0.0.1:30001", "[fd00::1]:30001"} {
		if code, _ := check(t, mem, addr); code != 200 {
			t.Errorf("%s: %d, want 200", addr, code)
		}
	}
	if len(mem.open()) != 2 {
		t.Errorf("listeners %v, want one per address", mem.open())
	}

	// The second address cannot be bound for B: B fails as a whole and the
	// listener it got on the first address is closed again.
	mem.fail["[fd00::1]:30002"] = syscall.EADDRNOTAVAIL
	err := s.SyncServices(ctx, map[types.NamespacedName]uint16{svcA: 30001, svcB: 30002})
	if !errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Fatalf("SyncServices: %v, want EADDRNOTAVAIL", err)
	}
	if _, ok := mem.open()["10.0.0.1:30002"]; ok {
		t.Error("B's listener on the first address was left open")
	}
}

func TestServiceHealthClose(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	mem := newMemNet()
	s := NewServiceHealthServer("node-1", nil, WithListenFunc(mem.Listen))
	if err := s.SyncServices(ctx, map[types.NamespacedName]uint16{svcA: 30001, svcB: 30002}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if open := mem.open(); len(open) != 0 {
		t.Errorf("listeners left after Close: %v", open)
	}
	if len(s.Ports()) != 0 {
		t.Errorf("Ports() after Close: %v", s.Ports())
	}
	// Usable again.
	if err := s.SyncServices(ctx, map[types.NamespacedName]uint16{svcA: 30001}); err != nil {
		t.Fatal(err)
	}
	s.Close()
}

func TestServiceHealthRequestAfterClose(t *testing.T) {
	s := NewServiceHealthServer("node-1", nil)
	s.SyncEndpoints(map[types.NamespacedName]int{svcA: 4})
	// A request already accepted when the port closed: the handler finds
	// no open service and says so.
	rec := httptest.NewRecorder()
	s.handler(svcA).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	code, body := decode(t, rec.Result())
	if code != http.StatusServiceUnavailable || body["localEndpoints"] != float64(0) {
		t.Errorf("closed service: %d %v, want 503 with 0 endpoints", code, body)
	}
}

// TestServiceHealthUpdateServices applies a sequence of changes with
// UpdateServices and, beside it, the whole state they add up to with
// SyncServices on a second server: after each step both must have the same
// ports open, and UpdateServices must leave untouched the listeners of
// Services it was not given.
func TestServiceHealthUpdateServices(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	mem, fullMem := newMemNet(), newMemNet()
	s := NewServiceHealthServer("node-1", staticHealth(true), WithListenFunc(mem.Listen))
	defer s.Close()
	full := NewServiceHealthServer("node-1", staticHealth(true), WithListenFunc(fullMem.Listen))
	defer full.Close()

	type ports = map[types.NamespacedName]uint16
	state := ports{}
	for _, step := range []struct {
		name    string
		changes ports
		// wantOpen is the listeners that must be open after the step;
		// kept lists those that must be the ones open before it.
		wantOpen []string
		kept     []string
	}{
		{"adds", ports{svcA: 30001, svcB: 30002}, []string{":30001", ":30002"}, nil},
		{"one goes, one comes", ports{svcB: 0, svcC: 30003}, []string{":30001", ":30003"}, []string{":30001"}},
		{"the same port again", ports{svcA: 30001}, []string{":30001", ":30003"}, []string{":30001", ":30003"}},
		{"a port moves", ports{svcA: 31001}, []string{":30003", ":31001"}, []string{":30003"}},
		{"a port passes from one Service to another", ports{svcC: 0, svcB: 30003}, []string{":30003", ":31001"}, []string{":31001"}},
		{"closing a Service that has none", ports{svcC: 0}, []string{":30003", ":31001"}, []string{":30003", ":31001"}},
		{"nothing", nil, []string{":30003", ":31001"}, []string{":30003", ":31001"}},
		{"all go", ports{svcA: 0, svcB: 0}, nil, nil},
	} {
		before := mem.open()
		if err := s.UpdateServices(ctx, step.changes); err != nil {
			t.Fatalf("%s: UpdateServices: %v", step.name, err)
		}
		for name, port := range step.changes {
			if port == 0 {
				delete(state, name)
			} else {
				state[name] = port
			}
		}
		if err := full.SyncServices(ctx, maps.Clone(state)); err != nil {
			t.Fatalf("%s: SyncServices: %v", step.name, err)
		}
		if diff := cmp.Diff(full.Ports(), s.Ports()); diff != "" {
			t.Errorf("%s: Ports() after UpdateServices differ from after SyncServices (-sync +update):\n%s", step.name, diff)
		}
		after := mem.open()
		if diff := cmp.Diff(step.wantOpen, slices.Sorted(maps.Keys(after)), cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: listeners (-want +got):\n%s", step.name, diff)
		}
		for _, addr := range step.kept {
			if after[addr] != before[addr] {
				t.Errorf("%s: the listener on %s was reopened: #%d, then #%d", step.name, addr, before[addr], after[addr])
			}
		}
	}
}

// TestServiceHealthUpdateServicesRetries checks that a port that could not
// be opened is tried again by the next UpdateServices, even one that does
// not name its Service, until its Service is given another port or none,
// or the server is closed.
func TestServiceHealthUpdateServicesRetries(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	mem := newMemNet()
	s := NewServiceHealthServer("node-1", staticHealth(true), WithListenFunc(mem.Listen))
	defer s.Close()
	type ports = map[types.NamespacedName]uint16
	wantBindErrors := func(what string, err error, want ...string) {
		t.Helper()
		if diff := cmp.Diff(want, bindErrors(t, err), cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("%s: bind errors (-want +got):\n%s", what, diff)
		}
	}

	mem.fail[":30002"] = syscall.EADDRINUSE
	mem.fail[":30003"] = syscall.EADDRINUSE
	wantBindErrors("first", s.UpdateServices(ctx, ports{svcA: 30001, svcB: 30002}), "default/b:30002")
	// A failure of SyncServices is retried by UpdateServices too.
	wantBindErrors("sync", s.SyncServices(ctx, ports{svcA: 30001, svcB: 30002, svcC: 30003}), "default/b:30002", "kube-system/c:30003")
	wantBindErrors("still in use", s.UpdateServices(ctx, nil), "default/b:30002", "kube-system/c:30003")

	delete(mem.fail, ":30002")
	before := mem.open()[":30001"]
	wantBindErrors("freed", s.UpdateServices(ctx, nil), "kube-system/c:30003")
	if diff := cmp.Diff(ports{svcA: 30001, svcB: 30002}, s.Ports()); diff != "" {
		t.Errorf("Ports() after the retry (-want +got):\n%s", diff)
	}
	if mem.open()[":30001"] != before {
		t.Error("A's listener was reopened by the retry")
	}

	// C is given another port in use, then none: the first port is no
	// longer wanted, and after the second nothing is.
	mem.fail[":30004"] = syscall.EADDRINUSE
	wantBindErrors("moved", s.UpdateServices(ctx, ports{svcC: 30004}), "kube-system/c:30004")
	wantBindErrors("given up", s.UpdateServices(ctx, ports{svcC: 0}))
	delete(mem.fail, ":30003")
	delete(mem.fail, ":30004")
	wantBindErrors("after", s.UpdateServices(ctx, nil))
	if diff := cmp.Diff(ports{svcA: 30001, svcB: 30002}, s.Ports()); diff != "" {
		t.Errorf("Ports() after C gave up its port (-want +got):\n%s", diff)
	}

	// Close forgets the ports it could not open.
	mem.fail[":30005"] = syscall.EADDRINUSE
	wantBindErrors("before close", s.UpdateServices(ctx, ports{svcC: 30005}), "kube-system/c:30005")
	s.Close()
	delete(mem.fail, ":30005")
	wantBindErrors("after close", s.UpdateServices(ctx, nil))
	if len(s.Ports()) != 0 {
		t.Errorf("Ports() after Close and an empty UpdateServices: %v", s.Ports())
	}
}

func TestServiceHealthUpdateEndpoints(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	mem := newMemNet()
	s := NewServiceHealthServer("node-1", staticHealth(true), WithListenFunc(mem.Listen))
	defer s.Close()
	if err := s.UpdateServices(ctx, map[types.NamespacedName]uint16{svcA: 30001, svcC: 30003}); err != nil {
		t.Fatal(err)
	}
	s.SyncEndpoints(map[types.NamespacedName]int{svcA: 2, svcB: 1, svcC: 0})
	if diff := cmp.Diff(map[types.NamespacedName]int{svcA: 2, svcB: 1}, s.LocalEndpoints()); diff != "" {
		t.Errorf("LocalEndpoints() after SyncEndpoints (-want +got):\n%s", diff)
	}
	s.UpdateEndpoints(map[types.NamespacedName]int{svcA: 0, svcC: 3})
	if diff := cmp.Diff(map[types.NamespacedName]int{svcB: 1, svcC: 3}, s.LocalEndpoints()); diff != "" {
		t.Errorf("LocalEndpoints() after UpdateEndpoints (-want +got):\n%s", diff)
	}
	if code, body := check(t, mem, ":30001"); code != 503 || body["localEndpoints"] != float64(0) {
		t.Errorf("A after losing its endpoints: %d %v, want 503 with 0", code, body)
	}
	if code, body := check(t, mem, ":30003"); code != 200 || body["localEndpoints"] != float64(3) {
		t.Errorf("C after gaining endpoints: %d %v, want 200 with 3", code, body)
	}
	s.UpdateEndpoints(map[types.NamespacedName]int{svcC: -1})
	if diff := cmp.Diff(map[types.NamespacedName]int{svcB: 1}, s.LocalEndpoints()); diff != "" {
		t.Errorf("LocalEndpoints() after a negative count (-want +got):\n%s", diff)
	}
}

// TestServiceHealthSetNodeAddresses checks that the open ports follow the
// node's addresses: the listener on an address that stays keeps serving,
// the one on an address that went is closed, a new address gets one, a
// port that cannot be opened on a new address is closed everywhere and
// tried again by the next UpdateServices, and no address means every
// address.
func TestServiceHealthSetNodeAddresses(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	mem := newMemNet()
	addr := netip.MustParseAddr
	s := NewServiceHealthServer("node-1", staticHealth(true), WithListenFunc(mem.Listen), WithNodeAddresses(addr("10.0.0.1")))
	defer s.Close()
	s.SyncEndpoints(map[types.NamespacedName]int{svcA: 1, svcB: 1})
	if err := s.SyncServices(ctx, map[types.NamespacedName]uint16{svcA: 30001, svcB: 30002}); err != nil {
		t.Fatal(err)
	}
	listening := func() []string { return slices.Sorted(maps.Keys(mem.open())) }
	wantListening := func(what string, want ...string) {
		t.Helper()
		if diff := cmp.Diff(want, listening()); diff != "" {
			t.Errorf("%s: listeners (-want +got):\n%s", what, diff)
		}
		for _, a := range want {
			if code, _ := check(t, mem, a); code != http.StatusOK {
				t.Errorf("%s: GET %s: %d, want 200", what, a, code)
			}
		}
	}
	wantListening("at start", "10.0.0.1:30001", "10.0.0.1:30002")

	// The InternalIP changed.
	if err := s.SetNodeAddresses(ctx, addr("10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	wantListening("moved", "10.0.0.2:30001", "10.0.0.2:30002")
	kept := mem.open()["10.0.0.2:30001"]

	// An IPv6 address more, the same again in another order, and one
	// twice: the IPv4 listeners stay as they are.
	for _, addrs := range [][]netip.Addr{{addr("10.0.0.2"), addr("fd00::2")}, {addr("fd00::2"), addr("10.0.0.2"), addr("fd00::2")}} {
		if err := s.SetNodeAddresses(ctx, addrs...); err != nil {
			t.Fatal(err)
		}
	}
	wantListening("an address added", "10.0.0.2:30001", "10.0.0.2:30002", "[fd00::2]:30001", "[fd00::2]:30002")
	if got := mem.open()["10.0.0.2:30001"]; got != kept {
		t.Errorf("the listener on the address that stayed was reopened (#%d, was #%d)", got, kept)
	}
	if diff := cmp.Diff([]netip.Addr{addr("10.0.0.2"), addr("fd00::2")}, s.NodeAddresses(), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("NodeAddresses (-want +got):\n%s", diff)
	}

	// B's port cannot be opened on the next address: B is closed on every
	// address, A moves, and B is opened once the port is free.
	mem.fail["10.0.0.3:30002"] = syscall.EADDRINUSE
	err := s.SetNodeAddresses(ctx, addr("10.0.0.3"))
	if got := bindErrors(t, err); !slices.Equal(got, []string{"default/b:30002"}) {
		t.Errorf("SetNodeAddresses returned bind errors %v, want B's", got)
	}
	wantListening("B failed", "10.0.0.3:30001")
	if diff := cmp.Diff(map[types.NamespacedName]uint16{svcA: 30001}, s.Ports()); diff != "" {
		t.Errorf("Ports (-want +got):\n%s", diff)
	}
	delete(mem.fail, "10.0.0.3:30002")
	if err := s.UpdateServices(ctx, nil); err != nil {
		t.Fatal(err)
	}
	wantListening("B retried", "10.0.0.3:30001", "10.0.0.3:30002")

	// No address: every address, and new ports there too.
	if err := s.SetNodeAddresses(ctx, netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateServices(ctx, map[types.NamespacedName]uint16{svcC: 30003}); err != nil {
		t.Fatal(err)
	}
	s.UpdateEndpoints(map[types.NamespacedName]int{svcC: 1})
	wantListening("every address", ":30001", ":30002", ":30003")
}
