package iptables

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseVersion(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Version
		mode    string
		wantErr bool
	}{
		{in: "iptables v1.8.9 (nf_tables)", want: Version{1, 8, 9}, mode: "nf_tables"},
		{in: "iptables v1.8.7 (legacy)\n", want: Version{1, 8, 7}, mode: "legacy"},
		{in: "ip6tables v1.4.21", want: Version{1, 4, 21}},
		{in: "iptables v1.6", want: Version{1, 6, 0}},
		{in: "1.8.10", want: Version{1, 8, 10}},
		{in: "iptables vfoo", wantErr: true},
		{in: "", wantErr: true},
		{in: "iptables v1.2.3.4", wantErr: true},
		{in: "iptables v1", wantErr: true},
	} {
		got, mode, err := parseVersionOutput(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("%q: error %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if got != tc.want || mode != tc.mode {
			t.Errorf("%q: got %v %q, want %v %q", tc.in, got, mode, tc.want, tc.mode)
		}
		if v, err := ParseVersion(tc.in); err == nil && v != got {
			t.Errorf("ParseVersion(%q) = %v, want %v", tc.in, v, got)
		}
	}
}

func TestVersionAtLeast(t *testing.T) {
	for _, tc := range []struct {
		a, b Version
		want bool
	}{
		{Version{1, 8, 9}, Version{1, 6, 2}, true},
		{Version{1, 6, 2}, Version{1, 6, 2}, true},
		{Version{1, 6, 1}, Version{1, 6, 2}, false},
		{Version{1, 4, 21}, Version{1, 6, 0}, false},
		{Version{2, 0, 0}, Version{1, 9, 9}, true},
		{Version{0, 9, 9}, Version{1, 0, 0}, false},
	} {
		if got := tc.a.AtLeast(tc.b); got != tc.want {
			t.Errorf("%v.AtLeast(%v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
	if s := (Version{1, 8, 9}).String(); s != "1.8.9" {
		t.Errorf("String() = %q", s)
	}
}

func TestFeatures(t *testing.T) {
	for _, tc := range []struct {
		v    Version
		wait time.Duration
		want features
	}{
		{v: Version{1, 8, 9}, wait: 5 * time.Second, want: features{hasCheck: true, waitFlag: []string{"-w", "5"}, restoreWaitFlag: []string{"-w", "5"}, randomFully: true, lockFile: true}},
		{v: Version{1, 8, 7}, wait: 1500 * time.Millisecond, want: features{hasCheck: true, waitFlag: []string{"-w", "2", "-W", "100000"}, restoreWaitFlag: []string{"-w", "2", "-W", "100000"}, randomFully: true, lockFile: true}},
		{v: Version{1, 6, 1}, wait: 0, want: features{hasCheck: true, waitFlag: []string{"-w", "1", "-W", "100000"}, lockFile: true}},
		{v: Version{1, 6, 0}, wait: time.Second, want: features{hasCheck: true, waitFlag: []string{"-w", "1"}, lockFile: true}},
		{v: Version{1, 4, 21}, wait: time.Second, want: features{hasCheck: true, waitFlag: []string{"-w"}}},
		{v: Version{1, 4, 19}, wait: time.Second, want: features{hasCheck: true}},
		{v: Version{1, 4, 10}, wait: time.Second, want: features{}},
	} {
		got := featuresOf(tc.v, tc.wait)
		if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(features{})); diff != "" {
			t.Errorf("featuresOf(%v, %v) (-want +got):\n%s", tc.v, tc.wait, diff)
		}
	}
}
