package kernel

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2/ktesting"
)

func TestRequiredIPVSModules(t *testing.T) {
	for _, tc := range []struct {
		release string
		want    []string
	}{
		{"3.10.0-957.1.3.el7.x86_64", []string{"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "nf_conntrack_ipv4"}},
		{"4.18.20", []string{"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "nf_conntrack_ipv4"}},
		{"4.19", []string{"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "nf_conntrack"}},
		{"6.18.44-fc-v669", []string{"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "nf_conntrack"}},
	} {
		v, err := ParseVersion(tc.release)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, RequiredIPVSModules(v)); diff != "" {
			t.Errorf("RequiredIPVSModules(%s) (-want +got):\n%s", tc.release, diff)
		}
	}
}

func TestIPVSSchedulerModule(t *testing.T) {
	if got, err := IPVSSchedulerModule("mh"); err != nil || got != "ip_vs_mh" {
		t.Errorf(`IPVSSchedulerModule("mh") = %q, %v`, got, err)
	}
	for _, bad := range []string{"", "roundrobin", "RR", "rr; rm -rf /"} {
		if _, err := IPVSSchedulerModule(bad); err == nil {
			t.Errorf("IPVSSchedulerModule(%q) did not fail", bad)
		}
	}
	s := IPVSSchedulers()
	s[0] = "changed"
	if IPVSSchedulers()[0] != "rr" {
		t.Error("IPVSSchedulers returns a shared slice")
	}
}

func TestCanUseIPVS(t *testing.T) {
	allIPSet := IPSetModules()
	for _, tc := range []struct {
		name       string
		files      map[string]string
		modprobe   []string
		schedulers []string
		want       *IPVSUnavailableError // nil: usable
		wantCalls  []string
	}{{
		name:  "this machine: IPVS not built, no modules to load, netfilter and ipset built in",
		files: layoutThisMachine(t),
		want: &IPVSUnavailableError{
			Kernel:  Version{6, 18, 44, "6.18.44-fc-v669"},
			Modules: []string{"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh"},
		},
	}, {
		name:       "this machine with the mh scheduler",
		files:      layoutThisMachine(t),
		schedulers: []string{"mh", "rr"},
		want: &IPVSUnavailableError{
			Kernel:     Version{6, 18, 44, "6.18.44-fc-v669"},
			Modules:    []string{"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh"},
			Schedulers: []string{"ip_vs_mh"},
		},
	}, {
		name:       "debian: everything loads with modprobe",
		files:      layoutDebianCloud(t),
		modprobe:   append([]string{"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "ip_vs_mh"}, allIPSet...),
		schedulers: []string{"mh"},
		wantCalls:  append([]string{"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "ip_vs_mh"}, allIPSet...),
	}, {
		name:       "debian: modprobe cannot load sh, the scheduler or two set types",
		files:      layoutDebianCloud(t),
		modprobe:   []string{"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_set", "xt_set", "ip_set_hash_ipport", "ip_set_hash_ipportip", "ip_set_hash_ipportnet", "ip_set_hash_net"},
		schedulers: []string{"lc"},
		want: &IPVSUnavailableError{
			Kernel:     Version{6, 1, 0, "6.1.0-56-cloud-amd64"},
			Modules:    []string{"ip_vs_sh"},
			Schedulers: []string{"ip_vs_lc"},
			IPSet:      []string{"ip_set_hash_netport", "ip_set_bitmap_port"},
		},
		wantCalls: append([]string{"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "ip_vs_lc"}, allIPSet...),
	}, {
		name:  "centos 7: all loaded, nf_conntrack_ipv4 is the conntrack module",
		files: layoutCentOS7(t),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			fm := &fakeModprobe{t: t, loadable: tc.modprobe}
			k := &Kernel{Root: writeTree(t, tc.files), Exec: fm.Exec()}
			err := k.CanUseIPVS(ctx, tc.schedulers...)
			var got *IPVSUnavailableError
			if err != nil && !errors.As(err, &got) {
				t.Fatalf("CanUseIPVS: unexpected error %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("CanUseIPVS error (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantCalls, fm.calls); diff != "" {
				t.Errorf("modprobe calls (-want +got):\n%s", diff)
			}
			if got != nil {
				for _, m := range got.Missing() {
					if !strings.Contains(err.Error(), m) {
						t.Errorf("error %q does not name missing module %s", err, m)
					}
				}
			}
		})
	}
}

func TestCanUseIPVSErrors(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	k := &Kernel{Root: writeTree(t, layoutThisMachine(t))}
	err := k.CanUseIPVS(ctx, "fastest")
	var ue *IPVSUnavailableError
	if err == nil || errors.As(err, &ue) || !strings.Contains(err.Error(), "fastest") {
		t.Errorf("unknown scheduler: got %v, want a plain error naming it", err)
	}
	k = &Kernel{Root: writeTree(t, map[string]string{})}
	if err := k.CanUseIPVS(ctx); err == nil || errors.As(err, &ue) {
		t.Errorf("no osrelease: got %v, want a read error", err)
	}
}

func TestIPVSUnavailableErrorMessage(t *testing.T) {
	e := &IPVSUnavailableError{
		Kernel:     Version{6, 18, 44, "6.18.44-fc-v669"},
		Modules:    []string{"ip_vs", "ip_vs_rr"},
		Schedulers: []string{"ip_vs_mh"},
		IPSet:      []string{"xt_set"},
	}
	want := "kernel 6.18.44-fc-v669 cannot run IPVS mode: missing IPVS modules ip_vs, ip_vs_rr; missing scheduler modules ip_vs_mh; missing ipset modules xt_set"
	if e.Error() != want {
		t.Errorf("Error() =\n%s\nwant\n%s", e.Error(), want)
	}
}
