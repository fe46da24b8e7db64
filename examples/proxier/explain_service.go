package main

import (
	"context"
	"errors"
	"flag"
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

// explainServiceCmd is `proxier explain service NAMESPACE/NAME[:PORT]`:
// it reads the Service, the EndpointSlices of its namespace and this
// node's Node from the cluster the proxier's flags name (--kubeconfig,
// --master, in-cluster, or --manifests) and prints, per port, every
// endpoint with the verdict the trackers reach on this node
// (--hostname-override), as text or, with -o json, as JSON. It only reads.
// It returns 0 when it explained the Service, 1 when it could not read
// what it needs (the message names it) and 2 for a bad command line.
func explainServiceCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return explainService(ctx, args, stdout, stderr, &environment{})
}

// explainService is explainServiceCmd in env, whose client, when set,
// replaces the cluster the flags name.
func explainService(ctx context.Context, args []string, stdout, stderr io.Writer, env *environment) int {
	target, o, output, proxyName, err := parseExplainServiceArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "proxier explain service:", err)
		return 2
	}
	report, err := readAndExplainService(ctx, target, o, proxyName, env, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "proxier explain service:", err)
		return 1
	}
	if output == "json" {
		err = report.WriteJSON(stdout)
	} else {
		err = report.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "proxier explain service:", err)
		return 1
	}
	return 0
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

// parseExplainServiceArgs reads the target and the proxier's own flags
// (see newFlagSet), with -o and --service-proxy-name. The target comes
// first or after the flags.
func parseExplainServiceArgs(args []string, stderr io.Writer) (serviceTarget, *options, string, string, error) {
	var positional string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		positional, args = args[0], args[1:]
	}
	o, fs, k := newFlagSet(stderr)
	var output, proxyName string
	fs.StringVar(&output, "o", "text", "Output format: text or json.")
	fs.StringVar(&output, "output", "text", "The same as -o.")
	fs.StringVar(&proxyName, "service-proxy-name", "", "The service.kubernetes.io/service-proxy-name this proxy serves; empty for the default proxy, which serves the Services without the label.")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: proxier explain service NAMESPACE/NAME[:PORT] [flags]\n\nSays which endpoints of the Service this node's proxy uses, and why each other one is left out.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return serviceTarget{}, nil, "", "", err
	}
	rest := fs.Args()
	if positional == "" && len(rest) > 0 {
		positional, rest = rest[0], rest[1:]
	}
	if len(rest) > 0 {
		return serviceTarget{}, nil, "", "", fmt.Errorf("unexpected arguments %s", logsafe.Quote(strings.Join(rest, " ")))
	}
	if positional == "" {
		return serviceTarget{}, nil, "", "", errors.New("missing NAMESPACE/NAME[:PORT]")
	}
	target, err := parseServiceTarget(positional)
	if err != nil {
		return serviceTarget{}, nil, "", "", err
	}
	if output != "text" && output != "json" {
		return serviceTarget{}, nil, "", "", fmt.Errorf("-o %s: want text or json", logsafe.Quote(output))
	}
	if o, err = completeOptions(o, fs, k); err != nil {
		return serviceTarget{}, nil, "", "", err
	}
	return target, o, output, proxyName, nil
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
