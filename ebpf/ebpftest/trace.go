package ebpftest

import (
	"fmt"
	"net/netip"
	"sort"

	v1 "k8s.io/api/core/v1"

	"github.com/proxykit/proxykit/ebpf"
)

// Connection is a socket's connect(2) or sendmsg(2) to a destination, as
// the cgroup programs see it.
type Connection struct {
	Destination ebpf.Frontend
	// Affinity is the endpoint an earlier connection from the socket's
	// network namespace went to, within the Service's affinity timeout;
	// the zero value for none.
	Affinity netip.AddrPort
}

// Outcome is one way a traced connection can end.
type Outcome struct {
	// Translated says the programs rewrote the destination, to
	// Endpoint. When false, the socket keeps its destination (it is no
	// frontend) unless Refused.
	Translated bool
	Endpoint   netip.AddrPort
	// Refused says connect or sendmsg fails with ECONNREFUSED: the
	// frontend's set has no endpoint.
	Refused bool
	// Probability is the chance of this outcome, 1 over the set's count
	// for a random pick.
	Probability float64
	// Sticky says the outcome came from the affinity entry.
	Sticky bool
}

// String returns "-> ADDR:PORT (p=0.5)", "refused" or "pass".
func (o Outcome) String() string {
	switch {
	case o.Refused:
		return "refused"
	case !o.Translated:
		return "pass"
	case o.Sticky:
		return fmt.Sprintf("-> %s (sticky)", o.Endpoint)
	}
	return fmt.Sprintf("-> %s (p=%.4g)", o.Endpoint, o.Probability)
}

// Trace returns what the programs do with c from the fake's maps: one
// outcome per endpoint the destination can reach, with probabilities
// that add up to 1 (endpoints in several slots add up), sorted by
// endpoint; a single pass or refusal otherwise. A slot naming a missing
// endpoint, or one of another set, passes untranslated as the program
// does, and counts in the pass outcome.
func (f *Fake) Trace(c Connection) []Outcome {
	return Trace(f.state, c)
}

// Trace is Fake.Trace over any State, such as one a Datapath dumped.
//
// An SCTP destination always passes untranslated, whatever the maps hold:
// the kernel runs no cgroup connect hook on SCTP's connect, so the writer's
// SCTP frontends are there for a reader of the maps that sees packets, not
// for the socket programs (see the ebpf package's documentation).
func Trace(s *ebpf.State, c Connection) []Outcome {
	if c.Destination.Protocol == v1.ProtocolSCTP {
		return []Outcome{{Probability: 1}}
	}
	return traceMaps(s, c)
}

// traceMaps is Trace by the maps alone.
func traceMaps(s *ebpf.State, c Connection) []Outcome {
	svc, ok := s.Services[c.Destination]
	if !ok {
		return []Outcome{{Probability: 1}}
	}
	if svc.Count == 0 {
		return []Outcome{{Refused: true, Probability: 1}}
	}
	if c.Affinity.IsValid() && svc.AffinitySeconds > 0 {
		for slot := range svc.Count {
			id := s.Slots[ebpf.SlotKey{Service: svc.ID, Slot: slot}]
			if ep, ok := s.Endpoints[id]; ok && ep.Service == svc.ID && ep.AddrPort() == c.Affinity {
				return []Outcome{{Translated: true, Endpoint: c.Affinity, Probability: 1, Sticky: true}}
			}
		}
	}
	p := 1 / float64(svc.Count)
	byEP := map[netip.AddrPort]float64{}
	var pass float64
	for slot := range svc.Count {
		id, ok := s.Slots[ebpf.SlotKey{Service: svc.ID, Slot: slot}]
		ep, found := s.Endpoints[id]
		if !ok || !found || ep.Service != svc.ID {
			pass += p
			continue
		}
		byEP[ep.AddrPort()] += p
	}
	var out []Outcome
	for ap, prob := range byEP {
		out = append(out, Outcome{Translated: true, Endpoint: ap, Probability: prob})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Endpoint.Compare(out[j].Endpoint) < 0 })
	if pass > 0 {
		out = append(out, Outcome{Probability: pass})
	}
	return out
}

// Routes returns, one frontend a line and sorted, what each frontend of s
// resolves to: its flags and affinity, and its endpoints with how many
// slots each holds, or "refused". Two states whose programs behave alike
// print the same whatever ids and slot order their writers chose, which
// makes it the dump to compare a partial sync with a full one.
func Routes(s *ebpf.State) string {
	var lines []string
	for fr, svc := range s.Services {
		line := fmt.Sprintf("%s flags=%d affinity=%d:", fr, svc.Flags, svc.AffinitySeconds)
		// By the maps alone, SCTP's frontends included: two states print
		// alike only if their maps resolve alike.
		for _, o := range traceMaps(s, Connection{Destination: fr}) {
			switch {
			case o.Refused:
				line += " refused"
			case !o.Translated:
				line += fmt.Sprintf(" pass*%d", int(o.Probability*float64(svc.Count)+0.5))
			default:
				line += fmt.Sprintf(" %s*%d", o.Endpoint, int(o.Probability*float64(svc.Count)+0.5))
			}
		}
		lines = append(lines, line)
	}
	sort.Strings(lines)
	out := ""
	for _, l := range lines {
		out += l + "\n"
	}
	return out
}
