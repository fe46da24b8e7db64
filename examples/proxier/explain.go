package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/proxykit/proxykit/explain"
	"github.com/proxykit/proxykit/internal/logsafe"
	"github.com/proxykit/proxykit/iptables"
	"github.com/proxykit/proxykit/kubeproxy"
	"github.com/proxykit/proxykit/proxier"
)

// explainUsage is the help of `proxier explain`.
const explainUsage = `Usage:
  proxier explain packet DEST_IP:PORT/PROTO [--from ADDR|node|pod|outside] [flags]
  proxier explain drift [flags]
  proxier explain service NAMESPACE/NAME[:PORT] [flags]

Reads this node's service rules (iptables-save, or nft list table) and
explains, without changing anything:
  packet   every way a new connection to DEST can end, with its probability:
           the endpoint it is DNATed to, masquerade or not, or the rule that
           rejects or drops it, and the rules or chains on its way;
  drift    the packets to every Service address, port and node port whose
           outcome differs between the live rules and what this proxier
           would program for the objects (--manifests or the API server),
           and the chains, rules and elements missing or extra;
  service  a Service's endpoints, and why each is used or left out.

The proxier's own flags say what to read and render: --mode (or
--proxy-mode), --chain-prefix, --hostname-override, --cluster-cidr,
--manifests or --kubeconfig, ...; and:
`

// explainOptions are the flags of `proxier explain`, besides the
// proxier's.
type explainOptions struct {
	*options
	// from is --from; output is -o; netns is --netns; backend is
	// --iptables-backend; proxyName is --service-proxy-name.
	from, output, netns, backend, proxyName string
	// trace is --trace: explain service also traces the ways in.
	trace bool
	// stderr takes the warnings of a view that still explains.
	stderr io.Writer
	// args are the view's positional arguments.
	args []string
}

// explainMain runs `proxier explain VIEW ARGS...`: args are those after
// "explain". Results go to env.stdout, errors and usage to stderr. It
// returns the exit status: 0 when explained, 2 for a bad command line, 1
// when something could not be read, with a message that names it.
func explainMain(ctx context.Context, args []string, env *environment, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, explainUsage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	view := args[0]
	var run func(context.Context, *explainOptions, *environment) error
	switch view {
	case "packet":
		run = explainPacket
	case "drift":
		run = explainDrift
	case "service":
		run = explainServiceView
	default:
		fmt.Fprintf(stderr, "proxier explain: unknown view %q: want packet, drift or service\n", view)
		return 2
	}
	o, err := parseExplainOptions(view, args[1:], stderr)
	if o != nil {
		o.stderr = stderr
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "proxier explain %s: %v\n", view, err)
		return 2
	}
	if err := run(ctx, o, env); err != nil {
		fmt.Fprintf(stderr, "proxier explain %s: %v\n", view, err)
		return 1
	}
	return 0
}

// parseExplainOptions parses the proxier's flags and explain's own,
// before, between and after the positional arguments.
func parseExplainOptions(view string, args []string, stderr io.Writer) (*explainOptions, error) {
	o, fs, k := newFlagSet(stderr)
	e := &explainOptions{}
	fs.StringVar(&e.from, "from", string(explain.SourceNode), "explain packet: the sender: node (a process on this node), pod (a pod on this node, with an address of --cluster-cidr), outside (a client outside the cluster, 203.0.113.1 or 2001:db8::1), or an IP address.")
	fs.StringVar(&e.output, "o", "text", "Output format: text or json.")
	fs.StringVar(&e.output, "output", "text", "The same as -o.")
	fs.StringVar(&e.proxyName, "service-proxy-name", "", "explain service: the service.kubernetes.io/service-proxy-name this proxy serves; empty for the default proxy, which serves the Services without the label.")
	fs.BoolVar(&e.trace, "trace", true, "explain service: also trace each way in (cluster IP, node port, external IP, load-balancer VIP; from a pod, the node and outside) through the node's live rules (of --netns); --trace=false explains the endpoints alone, off the node.")
	fs.StringVar(&e.netns, "netns", "", "Read the rules and addresses of the network namespace at this path (such as /run/netns/NAME) instead of the current one.")
	fs.StringVar(&e.backend, "iptables-backend", "", "In iptables mode, read with the tools of this backend: legacy or nft; empty means the one that holds the proxy's chains.")
	fs.Usage = func() {
		fmt.Fprint(stderr, explainUsage)
		fs.PrintDefaults()
	}
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		e.args = append(e.args, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	o, err := completeOptions(o, fs, k)
	if err != nil {
		return nil, err
	}
	e.options = o
	switch e.output {
	case "text", "json":
	default:
		return nil, fmt.Errorf("-o %q: want text or json", e.output)
	}
	switch iptables.Backend(e.backend) {
	case "", iptables.BackendLegacy, iptables.BackendNFT:
	default:
		return nil, fmt.Errorf("--iptables-backend %q: want legacy or nft", e.backend)
	}
	if o.mode == modeIPVS {
		return nil, errors.New("--mode ipvs: the IPVS virtual servers are not read; explain reads iptables and nftables mode")
	}
	want := map[string]int{"packet": 1, "drift": 0, "service": 1}[view]
	missing := map[string]string{"packet": "DEST_IP:PORT/PROTO", "service": "NAMESPACE/NAME[:PORT]"}[view]
	switch {
	case len(e.args) == 0 && want > 0:
		return nil, fmt.Errorf("missing %s", missing)
	case len(e.args) != want:
		return nil, fmt.Errorf("want %d argument(s), got %s", want, logsafe.Quote(strings.Join(e.args, " ")))
	}
	if view == "service" {
		if _, err := parseServiceTarget(e.args[0]); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// target is what ReadKernel reads for o.
func (e *explainOptions) target() explain.Target {
	return explain.Target{Mode: e.mode, ChainPrefix: e.chainPrefix, Table: e.nftTable,
		Backend: iptables.Backend(e.backend), NetNS: e.netns}
}

// node is what a trace knows of this node for family: its addresses (of
// the namespace), a pod address from --cluster-cidr.
func (e *explainOptions) node(family v1.IPFamily) (explain.Node, error) {
	addrs, err := explain.NodeAddresses(e.netns, family)
	if err != nil {
		return explain.Node{}, err
	}
	n := explain.Node{Addrs: addrs}
	for _, p := range e.clusterCIDRs {
		// An address of the pod network that is not the node's (the
		// first is often the node's bridge).
		for a := p.Addr().Next(); p.Contains(a); a = a.Next() {
			if !slices.Contains(addrs, a) {
				n.PodAddr = append(n.PodAddr, a)
				break
			}
		}
	}
	return n, nil
}

func familyOf(a netip.Addr) v1.IPFamily {
	if a.Is4() {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}

// explainPacket is `proxier explain packet`.
func explainPacket(ctx context.Context, e *explainOptions, env *environment) error {
	dest, proto, err := explain.ParseDest(e.args[0])
	if err != nil {
		return err
	}
	from, err := explain.ParseSource(e.from)
	if err != nil {
		return fmt.Errorf("--from: %w", err)
	}
	family := familyOf(dest.Addr())
	rs, err := explain.ReadKernel(ctx, e.target(), family)
	if err != nil {
		return err
	}
	node, err := e.node(family)
	if err != nil {
		return err
	}
	ex, err := rs.Trace(explain.Packet{From: from, Dest: dest, Protocol: proto}, node)
	if err != nil {
		return err
	}
	if e.output == "json" {
		return ex.WriteJSON(env.stdout)
	}
	return ex.WriteText(env.stdout)
}

// explainDrift is `proxier explain drift`: it renders what this proxier
// would program with a dry run, reads the live rules, and compares them
// for each family the dry run renders; with -o json it writes one list of
// the families' drifts.
func explainDrift(ctx context.Context, e *explainOptions, env *environment) error {
	client, err := openCluster(ctx, e.options, env, false)
	if err != nil {
		return err
	}
	nodeName, err := e.nodeName()
	if err != nil {
		return err
	}
	// The dry run takes the node's addresses from those of the namespace
	// read when its Node object has none.
	host := *env.Host
	host.HostAddresses = func() ([]netip.Addr, error) {
		var all []netip.Addr
		for _, f := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
			a, err := explain.NodeAddresses(e.netns, f)
			if err != nil {
				return nil, err
			}
			all = append(all, a...)
		}
		return all, nil
	}
	var rendered bytes.Buffer
	p, err := kubeproxy.New(client, nodeName, e.kubeProxyConfig(), kubeproxy.WithHost(&host), kubeproxy.WithDryRun(&rendered),
		kubeproxy.WithProxierOptions(proxier.WithMetricsRegisterer(prometheus.NewRegistry())))
	if err != nil {
		return err
	}
	if err := p.RunOnce(ctx); err != nil {
		return fmt.Errorf("rendering the rules: %w", err)
	}
	wanted, err := explain.ParseDryRun(rendered.Bytes(), e.chainPrefix, e.localhostNodePorts)
	if err != nil {
		return err
	}
	list, err := client.CoreV1().Services(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing Services: %w", err)
	}
	services := make([]*v1.Service, 0, len(list.Items))
	for i := range list.Items {
		services = append(services, &list.Items[i])
	}
	var drifts []*explain.Drift
	for _, family := range []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol} {
		want := wanted[family]
		if want == nil {
			continue
		}
		live, err := explain.ReadKernel(ctx, e.target(), family)
		if err != nil {
			return err
		}
		node, err := e.node(family)
		if err != nil {
			return err
		}
		d, err := explain.Compare(live, want, explain.Grid(services, family, node), node)
		if err != nil {
			return err
		}
		drifts = append(drifts, d)
	}
	if e.output == "json" {
		// One document: a list with each family's drift.
		enc := json.NewEncoder(env.stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		return enc.Encode(drifts)
	}
	for _, d := range drifts {
		if err := d.WriteText(env.stdout); err != nil {
			return err
		}
	}
	return nil
}
