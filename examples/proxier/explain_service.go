package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/explain"
	"github.com/proxykit/proxykit/internal/logsafe"
)

// explainReadTimeout bounds the reads from the API server, so that an
// unreachable one is reported instead of waited for.
const explainReadTimeout = 30 * time.Second

// explainServiceView is `proxier explain service NAMESPACE/NAME[:PORT]`:
// it reads the Service, the EndpointSlices of its namespace and this
// node's Node from the cluster the proxier's flags name (--kubeconfig,
// --master, in-cluster, or --manifests) and prints, per port, every
// endpoint with the verdict the trackers reach on this node
// (--hostname-override), then (unless --trace=false) each way in traced
// through the node's live rules, as text or, with -o json, as JSON. It
// only reads. A way in that cannot be traced says why, and the command
// then fails after printing the report.
func explainServiceView(ctx context.Context, e *explainOptions, env *environment) error {
	target, err := parseServiceTarget(e.args[0])
	if err != nil {
		return err
	}
	stderr := e.stderr
	if stderr == nil {
		stderr = io.Discard
	}
	report, err := readAndExplainService(ctx, target, e.options, e.proxyName, env, stderr)
	if err != nil {
		return err
	}
	var traceErr error
	if e.trace {
		traceErr = traceServiceWays(ctx, e, report)
	}
	if e.output == "json" {
		err = report.WriteJSON(env.stdout)
	} else {
		err = report.WriteText(env.stdout)
	}
	if err != nil {
		return err
	}
	return traceErr
}

// traceServiceWays reads the live rules of each family the report has
// ports in and traces the ways in through them. It returns the first
// family's read error, after tracing what could be read.
func traceServiceWays(ctx context.Context, e *explainOptions, report *explain.ServiceReport) error {
	rules := map[v1.IPFamily]*explain.Ruleset{}
	nodes := map[v1.IPFamily]explain.Node{}
	var first error
	for _, p := range report.Ports {
		if _, done := nodes[p.Family]; done || !p.Proxied {
			continue
		}
		node, err := e.node(p.Family)
		if err == nil {
			nodes[p.Family] = node
			var rs *explain.Ruleset
			if rs, err = explain.ReadKernel(ctx, e.target(), p.Family); err == nil {
				rules[p.Family] = rs
			}
		}
		if err != nil && first == nil {
			first = fmt.Errorf("cannot trace the ways in (--trace=false explains the endpoints alone): %w", err)
		}
	}
	report.TraceWaysIn(rules, nodes)
	return first
}

// serviceTarget is NAMESPACE/NAME[:PORT].
type serviceTarget struct {
	namespace, name, port string
}

func parseServiceTarget(s string) (serviceTarget, error) {
	ns, rest, ok := strings.Cut(s, "/")
	if !ok || ns == "" || rest == "" {
		return serviceTarget{}, fmt.Errorf("want NAMESPACE/NAME[:PORT], not %s", logsafe.Quote(s))
	}
	name, port, _ := strings.Cut(rest, ":")
	if name == "" {
		return serviceTarget{}, fmt.Errorf("want NAMESPACE/NAME[:PORT], not %s", logsafe.Quote(s))
	}
	return serviceTarget{namespace: ns, name: name, port: port}, nil
}

// readAndExplainService reads the objects and explains them. A missing
// Node is said on stderr and explained without labels or addresses, as a
// proxy without its Node runs.
func readAndExplainService(ctx context.Context, target serviceTarget, o *options, proxyName string, env *environment, stderr io.Writer) (*explain.ServiceReport, error) {
	nodeName, err := o.nodeName()
	if err != nil {
		return nil, err
	}
	// Problems in --manifests are logged by the loader; keep them off
	// stdout.
	ctx = klog.NewContext(ctx, klog.Background())
	client, err := openCluster(ctx, o, env, false)
	if err != nil {
		return nil, fmt.Errorf("cannot read the cluster: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, explainReadTimeout)
	defer cancel()
	svc, err := client.CoreV1().Services(target.namespace).Get(ctx, target.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if o.manifests != "" {
			// The loader refuses what the API server would, per object,
			// with a log line that names the field.
			return nil, fmt.Errorf("service %s not found in --manifests, or refused there as invalid (see the log above)", logsafe.KRef(target.namespace, target.name))
		}
		return nil, fmt.Errorf("service %s not found", logsafe.KRef(target.namespace, target.name))
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read service %s: %w", logsafe.KRef(target.namespace, target.name), err)
	}
	list, err := client.DiscoveryV1().EndpointSlices(target.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("cannot list the EndpointSlices of namespace %s: %w", logsafe.Quote(target.namespace), err)
	}
	in := explain.ServiceInput{
		Service: svc,
		Slices:  make([]*discoveryv1.EndpointSlice, 0, len(list.Items)),
		Node:    explain.NodeInfo{Name: nodeName},
		Proxy:   explain.ProxySettings{ServiceProxyName: proxyName},
		Port:    target.port,
	}
	for i := range list.Items {
		in.Slices = append(in.Slices, &list.Items[i])
	}
	node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		fmt.Fprintf(stderr, "proxier explain service: node %s not found: explaining without its zone and addresses\n", logsafe.Quote(nodeName))
	case err != nil:
		return nil, fmt.Errorf("cannot read node %s: %w", logsafe.Quote(nodeName), err)
	default:
		in.Node.Labels = node.Labels
		in.Node.Addresses = nodeAddresses(node)
	}
	return explain.ExplainService(in)
}

// nodeAddresses returns the Node's InternalIPs, then its ExternalIPs, as
// the proxier takes them; unparsable ones are left out.
func nodeAddresses(node *v1.Node) []netip.Addr {
	var out []netip.Addr
	for _, kind := range []v1.NodeAddressType{v1.NodeInternalIP, v1.NodeExternalIP} {
		for _, a := range node.Status.Addresses {
			if a.Type != kind {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				out = append(out, ip)
			}
		}
	}
	return out
}
