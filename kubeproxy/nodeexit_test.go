package kubeproxy

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/proxykit/proxykit/proxy"
)

func exitNode(podCIDRs []string, addrs ...v1.NodeAddress) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Spec: v1.NodeSpec{PodCIDRs: podCIDRs}, Status: v1.NodeStatus{Addresses: addrs}}
}

func internal(a string) v1.NodeAddress { return v1.NodeAddress{Type: v1.NodeInternalIP, Address: a} }
func external(a string) v1.NodeAddress { return v1.NodeAddress{Type: v1.NodeExternalIP, Address: a} }

// TestNodeExit checks the exit of Config.ExitOnNodeChange against
// kube-proxy's NodeManager: it exits with 1 when the node IPs (the first
// address, InternalIP first, and the first of the other family) change
// from the first list's, when the Node is deleted, and, when it watches
// them, when the PodCIDRs change; a change of another address or of
// anything else is no exit. Each exit is logged with the old and the new
// values.
func TestNodeExit(t *testing.T) {
	start := exitNode([]string{"10.244.1.0/24"}, internal("192.168.0.1"), external("203.0.113.1"))
	for _, tc := range []struct {
		name     string
		start    *v1.Node // nil: no Node in the first list
		podCIDRs bool
		// next is the Node of an update (or add); nil is a delete.
		next     *v1.Node
		wantExit bool
		wantLog  []string
	}{
		{name: "labels", start: start, next: func() *v1.Node {
			n := start.DeepCopy()
			n.Labels = map[string]string{v1.LabelTopologyZone: "b"}
			return n
		}()},
		{name: "an InternalIP of the same family more", start: start,
			next: exitNode([]string{"10.244.1.0/24"}, internal("192.168.0.1"), internal("192.168.0.9"))},
		{name: "an ExternalIP changed", start: start,
			next: exitNode([]string{"10.244.1.0/24"}, internal("192.168.0.1"), external("203.0.113.2"))},
		{name: "the InternalIP changed", start: start, wantExit: true,
			next:    exitNode([]string{"10.244.1.0/24"}, internal("192.168.0.2"), external("203.0.113.1")),
			wantLog: []string{"NodeIPs changed for the node", `oldNodeIPs=["192.168.0.1"]`, `nodeIPs=["192.168.0.2"]`, `node="node-a"`}},
		{name: "an IPv6 address added", start: start, wantExit: true,
			next:    exitNode([]string{"10.244.1.0/24"}, internal("192.168.0.1"), internal("fd00::1")),
			wantLog: []string{`oldNodeIPs=["192.168.0.1"]`, `nodeIPs=["192.168.0.1","fd00::1"]`}},
		{name: "deleted", start: start, wantExit: true,
			wantLog: []string{"Node is being deleted", `node="node-a"`}},
		{name: "no Node at start, then one", wantExit: true,
			next:    exitNode(nil, internal("192.168.0.1")),
			wantLog: []string{"oldNodeIPs=null", `nodeIPs=["192.168.0.1"]`}},
		{name: "PodCIDRs changed, not watched", start: start,
			next: exitNode([]string{"10.244.2.0/24"}, internal("192.168.0.1"), external("203.0.113.1"))},
		{name: "PodCIDRs changed, watched", start: start, podCIDRs: true, wantExit: true,
			next:    exitNode([]string{"10.244.2.0/24"}, internal("192.168.0.1"), external("203.0.113.1")),
			wantLog: []string{"PodCIDRs changed for the node", `oldPodCIDRs=["10.244.1.0/24"]`, `podCIDRs=["10.244.2.0/24"]`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			var exits []int
			h := &nodeExit{logger: logger, podCIDRs: tc.podCIDRs, exit: func(code int) { exits = append(exits, code) }}
			if tc.start != nil {
				h.OnNodeAdd(tc.start)
			}
			h.OnNodeSynced()
			switch {
			case tc.next == nil:
				h.OnNodeDelete(tc.start)
			case tc.start == nil:
				h.OnNodeAdd(tc.next)
			default:
				h.OnNodeUpdate(tc.start, tc.next)
			}
			var want []int
			if tc.wantExit {
				want = []int{1}
			}
			if diff := cmp.Diff(want, exits); diff != "" {
				t.Errorf("exits (-want +got):\n%s", diff)
			}
			logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			for _, w := range tc.wantLog {
				if !strings.Contains(logs, w) {
					t.Errorf("the log does not say %q:\n%s", w, logs)
				}
			}
		})
	}
}

// TestExitOnNodeChange checks that New's proxier with ExitOnNodeChange
// calls the exit func (WithExitFunc) with 1 when the Node's InternalIP
// changes while it runs.
func TestExitOnNodeChange(t *testing.T) {
	for name, c := range map[string]struct {
		cfg    Config
		change func(node *v1.Node, i int)
	}{
		"InternalIP": {
			cfg: Config{ExitOnNodeChange: true},
			change: func(node *v1.Node, i int) {
				node.Status.Addresses = []v1.NodeAddress{internal("192.168.10." + strconv.Itoa(i))}
			},
		},
		// kube-proxy exits on a pod range change only in NodeCIDR mode,
		// where the ranges decide what traffic is local.
		"PodCIDRs in NodeCIDR mode": {
			cfg:    Config{ExitOnNodeChange: true, DetectLocalMode: proxy.LocalModeNodeCIDR},
			change: func(node *v1.Node, i int) { node.Spec.PodCIDRs = []string{"10.244." + strconv.Itoa(i) + ".0/24"} },
		},
	} {
		t.Run(name, func(t *testing.T) { testExitOnNodeChange(t, &c.cfg, c.change) })
	}
}

func testExitOnNodeChange(t *testing.T, cfg *Config, change func(*v1.Node, int)) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	_, h := newFakeHost(t)
	client := cluster()
	exits := make(chan int, 10)
	p, err := New(client, "node-a", cfg, WithHost(h), WithExitFunc(func(code int) { exits <- code }))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		// The exit may come before the first lists, which Run then
		// stops waiting for.
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	}()
	// Updates until the proxier, once running, sees one: each moves the
	// value on, so each is a change from the first list's.
	for i := 12; i < 250; i++ {
		node, err := client.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		change(node, i)
		if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		select {
		case code := <-exits:
			if code != 1 {
				t.Errorf("exit(%d), want exit(1)", code)
			}
			return
		case err := <-done:
			t.Fatalf("Run returned %v before the exit", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatal("no exit after the Node changed")
}
