package iptables_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/proxykit/proxykit/iptables"
)

// TestWriterAccounting checks the rules that count in kube-proxy's nfacct
// counters, in kube-proxy's words: the INVALID drop of KUBE-FORWARD names
// ct_state_invalid_dropped_pkts, and each node port of a service with
// endpoints gets, right before its own rule, the same rule for 127.0.0.0/8
// naming localhost_nps_accepted_pkts, only when node ports are served on
// loopback addresses. A change of the accounting makes the next sync full.
func TestWriterAccounting(t *testing.T) {
	const invalid = "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP"
	// localhostRule is kube-proxy's counting rule for the node-port rule r.
	localhostRule := func(r string) string {
		r = strings.Replace(r, " --dport ", " -d 127.0.0.0/8 --dport ", 1)
		return strings.Replace(r, " -j ", " -m nfacct --nfacct-name localhost_nps_accepted_pkts -j ", 1)
	}
	for _, tc := range []struct {
		name                     string
		acct                     iptables.Accounting
		localhost, acceptInvalid bool
		wantInvalid, wantLocal   bool
	}{
		{name: "no counters", localhost: true},
		{name: "both counters", acct: iptables.Accounting{InvalidDropped: true, LocalhostNodePorts: true}, localhost: true,
			wantInvalid: true, wantLocal: true},
		{name: "both counters, no localhost node ports", acct: iptables.Accounting{InvalidDropped: true, LocalhostNodePorts: true},
			wantInvalid: true},
		{name: "both counters, INVALID accepted", acct: iptables.Accounting{InvalidDropped: true, LocalhostNodePorts: true},
			localhost: true, acceptInvalid: true, wantLocal: true},
		{name: "localhost counter only", acct: iptables.Accounting{LocalhostNodePorts: true}, localhost: true, wantLocal: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := scnWriterConfig(true)
			cfg.LocalhostNodePorts, cfg.AcceptInvalid = tc.localhost, tc.acceptInvalid
			w := mustWriter(t, cfg)
			c := scnCluster()
			w.Sync(context.Background(), c.input())
			w.Applied(nil)
			w.SetAccounting(tc.acct)
			if tc.acct == (iptables.Accounting{}) {
				// No change: the next sync is full all the same, to
				// look at every rule.
				w.RequestFullSync()
			}
			res := w.Sync(context.Background(), c.input())
			if !res.Full {
				t.Fatal("the sync after SetAccounting was partial")
			}
			lines := strings.Split(string(res.Payload), "\n")
			var got, want []string
			nodePorts := 0
			for i, l := range lines {
				if strings.Contains(l, "nfacct") {
					got = append(got, l)
				}
				if strings.HasPrefix(l, "-A KUBE-FORWARD -m conntrack --ctstate INVALID ") && tc.wantInvalid {
					want = append(want, invalid)
				}
				if strings.HasPrefix(l, "-A KUBE-NODEPORTS ") && strings.Contains(l, " -j KUBE-EXT-") && !strings.Contains(l, "nfacct") {
					nodePorts++
					if tc.wantLocal {
						want = append(want, localhostRule(l))
						if i == 0 || lines[i-1] != localhostRule(l) {
							t.Errorf("%q is not right before %q", localhostRule(l), l)
						}
					}
				}
			}
			if nodePorts == 0 {
				t.Fatal("the cluster has no node port with endpoints")
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("rules naming nfacct counters (-want +got):\n%s", diff)
			}
		})
	}
}
