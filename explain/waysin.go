package explain

import (
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
)

// WayTrace is one way into a Service port traced through a node's rules,
// from one kind of sender.
type WayTrace struct {
	From Source         `json:"from"`
	Dest netip.AddrPort `json:"dest"`
	// Outcomes are the packet's outcomes (see Explanation); empty when
	// Error says why it could not be traced.
	Outcomes []Outcome `json:"outcomes,omitempty"`
	Error    string    `json:"error,omitempty"`
	// Differs says that the rules send this traffic to other endpoints
	// than those the trackers give it (WayIn.Endpoints), or reject or
	// drop some of it where the trackers have endpoints: the rules were
	// written from other objects, by another proxy, or changed by hand.
	// It is judged only where the trackers' endpoints are the whole
	// answer: a cluster IP from a pod, and the other ways from outside
	// the cluster (from the node or a pod, kube-proxy sends traffic to an
	// external address to every endpoint whatever the policy).
	Differs bool `json:"differs,omitempty"`
}

// TraceWaysIn traces every way into every port of the report through
// the rules of its family, from a pod and the node, and for node ports,
// external IPs and load-balancer VIPs from outside the cluster too, and
// stores the traces in each WayIn. A node port is traced to the first of
// the node's addresses of its family. A family without rules in rules
// gets traces whose Error says so.
func (r *ServiceReport) TraceWaysIn(rules map[v1.IPFamily]*Ruleset, nodes map[v1.IPFamily]Node) {
	for i := range r.Ports {
		p := &r.Ports[i]
		rs, node := rules[p.Family], nodes[p.Family]
		for j := range p.WaysIn {
			wi := &p.WaysIn[j]
			wi.Traces = traceWay(*wi, p.Family, rs, node)
		}
	}
}

func traceWay(wi WayIn, family v1.IPFamily, rs *Ruleset, node Node) []WayTrace {
	sources := []Source{FromPod(), FromNode()}
	if wi.Kind != WayClusterIP {
		sources = append(sources, FromOutside())
	}
	ip := wi.IP
	if !ip.IsValid() {
		for _, a := range node.Addrs {
			if familyOfAddr(a) == family {
				ip = a
				break
			}
		}
	}
	var out []WayTrace
	for _, from := range sources {
		t := WayTrace{From: from}
		switch {
		case rs == nil:
			t.Error = fmt.Sprintf("no %s rules were read", family)
		case !ip.IsValid():
			t.Error = fmt.Sprintf("the node has no %s address to send to", family)
		default:
			t.Dest = netip.AddrPortFrom(ip, uint16(wi.Port))
			ex, err := rs.Trace(Packet{From: from, Dest: t.Dest, Protocol: wi.Protocol}, node)
			if err != nil {
				t.Error = err.Error()
				break
			}
			t.From, t.Outcomes = ex.Packet.From, ex.Outcomes
			if (wi.Kind == WayClusterIP && from.Kind == SourcePod) || (wi.Kind != WayClusterIP && from.Kind == SourceOutside) {
				t.Differs = outcomesDiffer(ex.Outcomes, wi.Endpoints)
			}
		}
		out = append(out, t)
	}
	return out
}

// outcomesDiffer says whether the traced outcomes disagree with the
// trackers' endpoints: every outcome must be a DNAT to one of them, and
// each of them must be reached, or, without endpoints, nothing may be
// DNATed or accepted.
func outcomesDiffer(outcomes []Outcome, endpoints []string) bool {
	reached := map[string]bool{}
	for _, o := range outcomes {
		if !o.Endpoint.IsValid() {
			if len(endpoints) > 0 || o.Verdict == Accept {
				return true
			}
			continue
		}
		if !slices.Contains(endpoints, o.Endpoint.String()) {
			return true
		}
		reached[o.Endpoint.String()] = true
	}
	return len(reached) != len(endpoints)
}

func familyOfAddr(a netip.Addr) v1.IPFamily {
	if a.Unmap().Is4() {
		return v1.IPv4Protocol
	}
	return v1.IPv6Protocol
}
