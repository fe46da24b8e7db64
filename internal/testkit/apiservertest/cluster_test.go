package apiservertest

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/proxykit/proxykit/internal/testkit/kerneltest"
)

// TestAPIServerCluster checks what the tests of the tier rely on: two API
// servers share one etcd; the kube-proxy kubeconfig has kube-proxy's
// permissions and no more; a compaction expires an old resource version;
// an API server stops, restarts with its data, and pauses; and everything
// is gone after the test.
func TestAPIServerCluster(t *testing.T) {
	bin := Require(t)
	var procs []*process
	var dir string
	t.Run("cluster", func(t *testing.T) {
		cp := kerneltest.NewNS(t)
		a, b := netip.MustParseAddr("10.2.0.2"), netip.MustParseAddr("10.2.0.3")
		cp.AddAddr(t, "lo", netip.PrefixFrom(a, 32))
		cp.AddAddr(t, "lo", netip.PrefixFrom(b, 32))
		c := Start(t, cp, bin, Config{APIServers: []netip.Addr{a, b}, NoWatchCache: true})
		t.Cleanup(func() { procs, dir = c.procs, c.dir })
		ctx := context.Background()
		s0, s1 := c.APIServer(0), c.APIServer(1)

		cm, err := s0.Client().CoreV1().ConfigMaps("default").Create(ctx, &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Data: map[string]string{"v": "1"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := s1.Client().CoreV1().ConfigMaps("default").Get(ctx, "probe", metav1.GetOptions{}); err != nil || got.Data["v"] != "1" {
			t.Fatalf("the second API server reads %v (%v), want the first's write", got.Data, err)
		}

		t.Run("kube-proxy permissions", func(t *testing.T) {
			cfg, err := clientcmd.BuildConfigFromFlags("", s1.Kubeconfig(t))
			if err != nil {
				t.Fatal(err)
			}
			cfg.Dial = c.dialContext
			kp, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := kp.CoreV1().Services("").List(ctx, metav1.ListOptions{}); err != nil {
				t.Errorf("kube-proxy cannot list Services: %v", err)
			}
			if _, err := kp.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{}); err != nil {
				t.Errorf("kube-proxy cannot list EndpointSlices: %v", err)
			}
			_, err = kp.CoreV1().ConfigMaps("default").Get(ctx, "probe", metav1.GetOptions{})
			if !apierrors.IsForbidden(err) {
				t.Errorf("kube-proxy reading a ConfigMap: %v, want Forbidden", err)
			}
		})

		t.Run("compaction expires old versions", func(t *testing.T) {
			// Two updates: a watch from old resumes at the first, which
			// the compaction removes. (One resuming exactly at the
			// compacted revision would get a 500 instead: etcd still has
			// that event but no longer the object before it.)
			old := cm.ResourceVersion
			for _, v := range []string{"2", "3"} {
				cm.Data["v"] = v
				var err error
				if cm, err = s0.Client().CoreV1().ConfigMaps("default").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			// Before the compaction the old version still resumes.
			if ev := firstEvent(t, s0.Client(), old); ev.Type != watch.Modified {
				t.Fatalf("watch from %s before compaction: %v, want the update", old, ev.Type)
			}
			rev := c.Compact(t)
			if got := c.Revision(t); got != rev {
				t.Errorf("revision %d after compacting at %d: the compaction wrote", got, rev)
			}
			ev := firstEvent(t, s0.Client(), old)
			status, ok := ev.Object.(*metav1.Status)
			if ev.Type != watch.Error || !ok || status.Code != http.StatusGone {
				t.Fatalf("watch from %s after compaction at %d: %v %+v, want an error 410", old, rev, ev.Type, ev.Object)
			}
		})

		t.Run("stop and start", func(t *testing.T) {
			s0.Stop(t)
			if _, err := s1.Client().CoreV1().ConfigMaps("default").Get(ctx, "probe", metav1.GetOptions{}); err != nil {
				t.Errorf("the second API server with the first stopped: %v", err)
			}
			short, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := s0.Client().CoreV1().ConfigMaps("default").Get(short, "probe", metav1.GetOptions{})
			cancel()
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("the stopped API server: %v, want connection refused", err)
			}
			s0.Start(t)
			if got, err := s0.Client().CoreV1().ConfigMaps("default").Get(ctx, "probe", metav1.GetOptions{}); err != nil || got.Data["v"] != "3" {
				t.Errorf("after the restart: %v (%v), want the data kept", got.Data, err)
			}
		})

		t.Run("pause", func(t *testing.T) {
			s1.Pause(t)
			short, cancel := context.WithTimeout(ctx, time.Second)
			_, err := s1.Client().CoreV1().ConfigMaps("default").Get(short, "probe", metav1.GetOptions{})
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("the paused API server: %v, want no answer", err)
			}
			s1.Resume(t)
			if _, err := s1.Client().CoreV1().ConfigMaps("default").Get(ctx, "probe", metav1.GetOptions{}); err != nil {
				t.Errorf("after resuming: %v", err)
			}
		})
	})
	if len(procs) != 4 {
		t.Fatalf("%d processes started, want etcd, two API servers and one restart", len(procs))
	}
	for _, p := range procs {
		if !p.exited() {
			t.Errorf("%s still runs after the test", p.name)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the cluster's directory %s: %v, want it removed", dir, err)
	}
}

// firstEvent watches ConfigMaps from resourceVersion and returns the first
// event.
func firstEvent(t *testing.T, client kubernetes.Interface, resourceVersion string) watch.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := client.CoreV1().ConfigMaps("default").Watch(ctx, metav1.ListOptions{ResourceVersion: resourceVersion})
	if err != nil {
		t.Fatalf("watch from %s: %v", resourceVersion, err)
	}
	defer w.Stop()
	select {
	case ev, ok := <-w.ResultChan():
		if !ok {
			t.Fatalf("watch from %s closed without an event", resourceVersion)
		}
		return ev
	case <-ctx.Done():
		t.Fatalf("watch from %s: no event in 10s", resourceVersion)
	}
	return watch.Event{}
}
