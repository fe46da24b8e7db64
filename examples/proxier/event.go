package main

import (
	"context"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record/util"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/internal/logsafe"
)

// reportingController is the controller named in the events the proxier
// posts: kube-proxy's, so that whatever filters on it (kubectl get events
// --field-selector, dashboards) finds ours too.
const reportingController = "kube-proxy"

// startEventTimeout bounds the post of the start event, so that an API
// server that does not answer cannot hold back the exit of --once.
const startEventTimeout = 10 * time.Second

// recordStart posts, as kube-proxy does when it starts, a Normal event
// "Starting" (action StartKubeProxy, no note) about the Node nodeName, in
// the default namespace, through events.k8s.io/v1. It is posted once and
// synchronously: kube-proxy's broadcaster posts it in the background and
// may lose it when the process ends soon after, as --once does. A failure
// is logged, never returned: the proxier works without the event. Besides
// telling the cluster the proxier started, this is the one plain request
// the proxier makes, which client-go's request and rate-limiter histograms
// observe (list and watch requests are not), so the metrics served have
// the same families as kube-proxy's.
func recordStart(ctx context.Context, client kubernetes.Interface, nodeName string) {
	ctx, cancel := context.WithTimeout(ctx, startEventTimeout)
	defer cancel()
	ev := startEvent(nodeName, time.Now())
	if _, err := client.EventsV1().Events(ev.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		// The error can quote the API server's reply.
		klog.FromContext(ctx).Error(nil, "Could not post the start event", "node", logsafe.Quote(nodeName), "err", logsafe.Quote(err.Error()))
	}
}

// startEvent is the event recordStart posts at now: the fields kube-proxy's
// recorder fills, with the name it derives from the Node's name and the
// time (a random one when that would not be a valid name).
func startEvent(nodeName string, now time.Time) *eventsv1.Event {
	hostname, _ := os.Hostname()
	return &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      util.GenerateEventName(nodeName, now.UnixNano()),
			Namespace: metav1.NamespaceDefault,
		},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: reportingController,
		ReportingInstance:   reportingController + "-" + hostname,
		Action:              "StartKubeProxy",
		Reason:              "Starting",
		Regarding:           v1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: nodeName},
		Type:                v1.EventTypeNormal,
	}
}
