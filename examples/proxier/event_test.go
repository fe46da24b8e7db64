package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// wantStartEvent is the event kube-proxy v1.37's recorder posts at start
// about node, but for the fields that hold the time.
func wantStartEvent(t *testing.T, node string) eventsv1.Event {
	t.Helper()
	hostname, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Namespace: "default"},
		ReportingController: "kube-proxy",
		ReportingInstance:   "kube-proxy-" + hostname,
		Action:              "StartKubeProxy",
		Reason:              "Starting",
		Regarding:           v1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node},
		Type:                "Normal",
	}
}

// checkStartEvents compares the events in client with the one start event
// about node, whose name is the node's with the time appended and which has
// a time.
func checkStartEvents(t *testing.T, client *fake.Clientset, node string) {
	t.Helper()
	list, err := client.EventsV1().Events("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range list.Items {
		if !strings.HasPrefix(ev.Name, node+".") {
			t.Errorf("event name %q does not start with %q", ev.Name, node+".")
		}
		if ev.EventTime.IsZero() {
			t.Errorf("event %q has no eventTime", ev.Name)
		}
	}
	want := []eventsv1.Event{wantStartEvent(t, node)}
	if diff := cmp.Diff(want, list.Items,
		// The fake clientset fills in the kind and managed fields.
		cmpopts.IgnoreFields(metav1.ObjectMeta{}, "Name", "ManagedFields"), cmpopts.IgnoreFields(eventsv1.Event{}, "TypeMeta", "EventTime")); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestRecordStart(t *testing.T) {
	client := fake.NewClientset()
	recordStart(context.Background(), client, "node-a")
	checkStartEvents(t, client, "node-a")
}

// A refused post is logged, escaped, and does not stop the proxier.
func TestRecordStartRefused(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("refused\n\x1b[31mred")
	})
	var log logBuffer
	recordStart(testLogger(&log, 0), client, "node-a")
	if !strings.Contains(log.String(), "Could not post the start event") {
		t.Errorf("the refusal is not logged:\n%s", log.String())
	}
	if strings.Contains(log.String(), "\x1b") || strings.Contains(log.String(), "refused\n") {
		t.Errorf("the API server's reply reached the log unescaped:\n%s", log.String())
	}
}

// The proxier posts the event when it starts, in a dry run too, as
// kube-proxy does when its proxier starts.
func TestRunRecordsStart(t *testing.T) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.0.0.1"}}}}
	client := fake.NewClientset(node)
	var out bytes.Buffer
	env := dryRunEnvironment(t, &out)
	env.client = client
	if log, err := runArgs(t, env, "--dry-run", "--hostname-override", "node-a"); err != nil {
		t.Fatalf("dry run: %v\n%s", err, log)
	}
	checkStartEvents(t, client, "node-a")
}
