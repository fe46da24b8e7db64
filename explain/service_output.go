package explain

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/proxykit/proxykit/internal/logsafe"
)

// WriteJSON writes r as indented JSON. Every character outside printable
// ASCII, in names from the API too, is written as a \u escape, so that the
// output holds no terminal control sequence even where JSON allows the
// character raw; the values decode unchanged.
func (r *ServiceReport) WriteJSON(w io.Writer) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	b = append(svcASCIIJSON(b), '\n')
	_, err = w.Write(b)
	return err
}

// svcASCIIJSON escapes, in valid JSON, every rune that is not printable ASCII
// (json.Marshal escapes only the C0 controls and a few others): such runes
// appear only inside strings, where \uXXXX means the same.
func svcASCIIJSON(b []byte) []byte {
	var out bytes.Buffer
	out.Grow(len(b))
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		switch {
		case r < utf8.RuneSelf && r != 0x7f:
			out.WriteByte(byte(r))
		case r > 0xffff:
			r -= 0x10000
			fmt.Fprintf(&out, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
		default:
			// json.Marshal has replaced invalid UTF-8 with U+FFFD.
			fmt.Fprintf(&out, `\u%04x`, r)
		}
		b = b[n:]
	}
	return out.Bytes()
}

// svcSafeText escapes a sentence that may hold API text: printable ASCII
// stays, anything else becomes a Go escape, so that no control character
// or lookalike reaches a terminal. Names alone go through logsafe.Quote.
func svcSafeText(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r >= 0x20 && r < 0x7f {
			b.WriteRune(r)
			continue
		}
		q := strconv.QuoteRuneToASCII(r)
		b.WriteString(q[1 : len(q)-1])
	}
	// Ranging over invalid UTF-8 yields U+FFFD, escaped above.
	return b.String()
}

// WriteText writes r for a person: the Service, its slices, then per port
// and family a table of endpoints with the verdict for traffic to the
// cluster IP (INTERNAL) and from outside (EXTERNAL), followed by the
// reason of each endpoint left out. API text is escaped (see
// logsafe.Quote).
func (r *ServiceReport) WriteText(w io.Writer) error {
	q := logsafe.Quote
	var b bytes.Buffer
	fmt.Fprintf(&b, "Service %s/%s (%s) on node %s", q(r.Namespace), q(r.Name), q(r.Type), q(r.Node))
	if r.Zone != "" {
		fmt.Fprintf(&b, " in zone %s", q(r.Zone))
	}
	fams := make([]string, len(r.Families))
	for i, f := range r.Families {
		fams[i] = string(f)
	}
	fmt.Fprintf(&b, ", proxy families %s\n", q(strings.Join(fams, ",")))
	if r.Proxied {
		b.WriteString("  proxied: yes\n")
	} else {
		b.WriteString("  proxied: NO\n")
	}
	for _, s := range r.NotProxied {
		fmt.Fprintf(&b, "  not proxied: %s\n", svcSafeText(s))
	}
	for _, s := range r.Notes {
		fmt.Fprintf(&b, "  note: %s\n", svcSafeText(s))
	}
	if len(r.Slices) == 0 {
		b.WriteString("  slices: none\n")
	} else {
		b.WriteString("  slices:\n")
	}
	for _, s := range r.Slices {
		if s.Used {
			fmt.Fprintf(&b, "    %s (%s): used\n", q(s.Name), q(s.AddressType))
		} else {
			fmt.Fprintf(&b, "    %s (%s): IGNORED, %s: %s\n", q(s.Name), q(s.AddressType), s.Reason, svcSafeText(s.Detail))
		}
	}
	for i := range r.Ports {
		writePortText(&b, &r.Ports[i])
	}
	_, err := w.Write(b.Bytes())
	return err
}

func writePortText(b *bytes.Buffer, p *PortReport) {
	q := logsafe.Quote
	name := q(p.Name)
	if p.Name == "" {
		name = "(unnamed)"
	}
	fmt.Fprintf(b, "\nPort %s %d/%s, %s", name, p.Port, p.Protocol, p.Family)
	if p.TargetPort != "" {
		fmt.Fprintf(b, ", target port %s", q(p.TargetPort))
	}
	if p.NodePort != 0 {
		fmt.Fprintf(b, ", node port %d", p.NodePort)
	}
	b.WriteString("\n")
	if !p.Proxied {
		fmt.Fprintf(b, "  not proxied: %s\n", svcSafeText(p.NotProxied))
	} else {
		ext := p.ExternalPolicy
		if ext == "" {
			ext = "- (not reachable from outside)"
		}
		topo := p.Topology
		if topo == "" {
			topo = "none"
		}
		fmt.Fprintf(b, "  internal policy %s, external policy %s, topology %s, endpoints anywhere: %t\n", p.InternalPolicy, ext, topo, p.HasAnyEndpoints)
		for _, wi := range p.WaysIn {
			dest := "(node-port addresses):" + strconv.Itoa(wi.Port)
			if wi.IP.IsValid() {
				dest = wi.IP.String() + ":" + strconv.Itoa(wi.Port)
			}
			eps := strings.Join(wi.Endpoints, " ")
			if eps == "" {
				eps = "no endpoints"
			}
			fmt.Fprintf(b, "  way in: %s %s/%s (%s) -> %s\n", wi.Kind, dest, wi.Protocol, wi.Policy, q(eps))
			for _, t := range wi.Traces {
				writeWayTrace(b, t)
			}
		}
	}
	if len(p.Endpoints) == 0 {
		b.WriteString("  endpoints: none in any slice\n")
		return
	}
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  ENDPOINT\tSLICE\tNODE\tZONE\tREADY\tSERVING\tTERMINATING\tINTERNAL\tEXTERNAL")
	var why []string
	for _, e := range p.Endpoints {
		addr := q(e.Address)
		if e.Port != 0 {
			addr += ":" + strconv.Itoa(int(e.Port))
		}
		ext := "-"
		if e.External != nil {
			ext = svcVerdictWord(*e.External)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", addr, q(e.Slice), svcDash(q(e.NodeName)), svcDash(q(e.Zone)),
			svcYesNo(e.Ready), svcYesNo(e.Serving), svcYesNo(e.Terminating), svcVerdictWord(e.Internal), ext)
		if e.Internal.Detail != "" {
			why = append(why, fmt.Sprintf("  %s internal: %s: %s", addr, e.Internal.Reason, svcSafeText(e.Internal.Detail)))
		}
		if e.External != nil && e.External.Detail != "" && *e.External != e.Internal {
			why = append(why, fmt.Sprintf("  %s external: %s: %s", addr, e.External.Reason, svcSafeText(e.External.Detail)))
		}
	}
	_ = tw.Flush()
	for _, s := range why {
		b.WriteString(s + "\n")
	}
}

func svcVerdictWord(v EndpointVerdict) string {
	switch {
	case v.Used && v.Fallback:
		return "used (fallback)"
	case v.Used:
		return "used"
	}
	return "no: " + string(v.Reason)
}

func svcYesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func svcDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// writeWayTrace writes one traced way in under its way: its outcomes
// in the live rules, or why it could not be traced.
func writeWayTrace(b *bytes.Buffer, t WayTrace) {
	if t.Error != "" {
		fmt.Fprintf(b, "    from %s: not traced: %s\n", t.From.Kind, svcSafeText(t.Error))
		return
	}
	fmt.Fprintf(b, "    from %s to %s in the live rules:", t.From, t.Dest)
	for i, o := range t.Outcomes {
		if i > 0 {
			b.WriteString(";")
		}
		b.WriteString(" " + o.Summary())
	}
	b.WriteString("\n")
	if t.Differs {
		b.WriteString("      ! the rules do not send this traffic to the endpoints above (see proxier explain drift)\n")
	}
}
