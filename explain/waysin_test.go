package explain

import (
	"net/netip"
	"testing"
)

func TestOutcomesDiffer(t *testing.T) {
	to := func(s string) Outcome {
		return Outcome{Verdict: Accept, Endpoint: netip.MustParseAddrPort(s)}
	}
	both := []string{"10.244.0.11:8080", "10.244.0.12:8080"}
	for _, tc := range []struct {
		name      string
		outcomes  []Outcome
		endpoints []string
		want      bool
	}{
		{"both reached", []Outcome{to("10.244.0.11:8080"), to("10.244.0.12:8080")}, both, false},
		{"one endpoint missing from the rules", []Outcome{to("10.244.0.11:8080")}, both, true},
		{"an endpoint the trackers do not give", []Outcome{to("10.244.0.11:8080"), to("10.244.0.99:8080")}, both[:1], true},
		{"rejected with endpoints", []Outcome{{Verdict: Reject}}, both, true},
		{"rejected without endpoints", []Outcome{{Verdict: Reject}}, nil, false},
		{"accepted untouched without endpoints", []Outcome{{Verdict: Accept}}, nil, true},
		{"DNAT without endpoints", []Outcome{to("10.244.0.11:8080")}, nil, true},
		{"IPv6", []Outcome{to("[fd00::11]:8080")}, []string{"[fd00::11]:8080"}, false},
	} {
		if got := outcomesDiffer(tc.outcomes, tc.endpoints); got != tc.want {
			t.Errorf("%s: outcomesDiffer = %t, want %t", tc.name, got, tc.want)
		}
	}
}
