package kernel

import (
	"context"
	"errors"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/exec"
	fakeexec "k8s.io/utils/exec/testing"
)

func TestParseModules(t *testing.T) {
	in := `nf_conntrack 188416 2 nf_nat,xt_conntrack, Live 0x0000000000000000

ip_vs_rr 16384 0 - Live 0xffffffffc0a2e000
nvidia-drm 69632 0 - Live 0x0000000000000000 (POE)
   trailing_space   1 0 - Live 0x0
`
	want := []string{"nf_conntrack", "ip_vs_rr", "nvidia_drm", "trailing_space"}
	if diff := cmp.Diff(want, ParseModules([]byte(in))); diff != "" {
		t.Errorf("ParseModules (-want +got):\n%s", diff)
	}
	if got := ParseModules(nil); got != nil {
		t.Errorf("ParseModules(nil) = %v, want nil", got)
	}
}

func TestParseBuiltinModules(t *testing.T) {
	in := `kernel/net/netfilter/ipvs/ip_vs.ko
kernel/net/netfilter/nf_conntrack.ko
kernel/drivers/net/dummy.ko.xz
kernel/drivers/hid/hid-generic.ko
kernel/net/README
.ko

`
	want := []string{"ip_vs", "nf_conntrack", "dummy", "hid_generic"}
	if diff := cmp.Diff(want, ParseBuiltinModules([]byte(in))); diff != "" {
		t.Errorf("ParseBuiltinModules (-want +got):\n%s", diff)
	}
}

func TestModules(t *testing.T) {
	type check struct {
		module string
		has    bool
	}
	for _, tc := range []struct {
		name         string
		files        map[string]string
		wantLoadable bool
		wantConfig   string
		checks       []check
		wantErr      bool
	}{{
		name:       "this machine: no /proc/modules, config.gz",
		files:      layoutThisMachine(t),
		wantConfig: "/proc/config.gz",
		checks: []check{
			{"nf_conntrack", true}, {"ip_set", true}, {"xt_set", true}, {"ip_set_hash_ipport", true},
			{"br_netfilter", true}, {"ip_tables", true}, {"nf_tables", true}, {"xt_conntrack", true},
			{"xt_MASQUERADE", true}, {"xt_comment", true}, {"veth", true},
			{"ip_vs", false}, {"ip_vs_rr", false}, {"ip_set_hash_mac", false}, {"nf_conntrack_bridge", false},
			{"no_such_module", false},
		},
	}, {
		name:         "debian cloud: loaded, builtin list, =m in /boot/config",
		files:        layoutDebianCloud(t),
		wantLoadable: true,
		wantConfig:   "/boot/config-6.1.0-56-cloud-amd64",
		checks: []check{
			{"nf_conntrack", true}, {"nf-conntrack", true}, {"br_netfilter", true}, {"ipv6", true},
			{"ip_vs", false}, {"ip_set", false}, {"xt_set", false},
		},
	}, {
		name:         "centos 7: everything loaded, no config",
		files:        layoutCentOS7(t),
		wantLoadable: true,
		checks:       []check{{"nf_conntrack_ipv4", true}, {"ip_vs_sh", true}, {"nf_conntrack", false}, {"unix", true}},
	}, {
		name: "builtin list under /usr/lib/modules only",
		files: map[string]string{
			osreleasePath:                            "6.6.0\n",
			"/usr/lib/modules/6.6.0/modules.builtin": "kernel/net/netfilter/ipvs/ip_vs.ko\n",
		},
		checks: []check{{"ip_vs", true}, {"ip_vs_rr", false}},
	}, {
		name:    "no modules support and nothing describing the kernel",
		files:   map[string]string{osreleasePath: "6.6.0\n"},
		wantErr: true,
	}, {
		name:    "corrupt config.gz",
		files:   map[string]string{osreleasePath: "6.6.0\n", procConfigGz: "not gzip"},
		wantErr: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			k := &Kernel{Root: writeTree(t, tc.files)}
			m, err := k.Modules(ctx)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Modules() error = %v, want error %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if m.Loadable != tc.wantLoadable || m.ConfigPath != tc.wantConfig {
				t.Errorf("Loadable=%v ConfigPath=%q, want %v %q", m.Loadable, m.ConfigPath, tc.wantLoadable, tc.wantConfig)
			}
			for _, c := range tc.checks {
				if got := m.Has(c.module); got != c.has {
					t.Errorf("Has(%q) = %v, want %v", c.module, got, c.has)
				}
			}
		})
	}
}

func TestEnsureModules(t *testing.T) {
	for _, tc := range []struct {
		name        string
		files       map[string]string
		modprobe    []string // modules modprobe can load; nil Exec when "nil"
		noExec      bool
		ask         []string
		wantLoaded  []string
		wantMissing []string
		wantCalls   []string
	}{{
		name:      "already loaded or built in: no modprobe",
		files:     layoutDebianCloud(t),
		ask:       []string{"nf_conntrack", "ipv6", "br-netfilter"},
		wantCalls: nil,
	}, {
		name:       "modprobe loads some, others stay missing",
		files:      layoutDebianCloud(t),
		modprobe:   []string{"ip_vs", "ip_set"},
		ask:        []string{"ip_vs", "ip_set", "ip_vs_nope", "ip_vs", "nf_conntrack"},
		wantLoaded: []string{"ip_vs", "ip_set"},
		// ip_vs asked twice: probed once.
		wantMissing: []string{"ip_vs_nope"},
		wantCalls:   []string{"ip_vs", "ip_set", "ip_vs_nope"},
	}, {
		name:        "no exec: nothing probed",
		files:       layoutDebianCloud(t),
		noExec:      true,
		ask:         []string{"ip_vs"},
		wantMissing: []string{"ip_vs"},
	}, {
		name:        "this machine: no loadable modules, modprobe is pointless",
		files:       layoutThisMachine(t),
		modprobe:    []string{"ip_vs"},
		ask:         []string{"ip_vs", "nf_conntrack"},
		wantMissing: []string{"ip_vs"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			fm := &fakeModprobe{t: t, loadable: tc.modprobe}
			k := &Kernel{Root: writeTree(t, tc.files)}
			if !tc.noExec {
				k.Exec = fm.Exec()
			}
			loaded, err := k.EnsureModules(ctx, tc.ask...)
			var missing []string
			var me *MissingModulesError
			if errors.As(err, &me) {
				missing = me.Modules
			} else if err != nil {
				t.Fatalf("EnsureModules: %v", err)
			}
			if diff := cmp.Diff(tc.wantLoaded, loaded); diff != "" {
				t.Errorf("loaded (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantMissing, missing); diff != "" {
				t.Errorf("missing (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantCalls, fm.calls); diff != "" {
				t.Errorf("modprobe calls (-want +got):\n%s", diff)
			}
		})
	}
}

func TestModulesUnreadableProcModules(t *testing.T) {
	// /proc/modules as a directory: reading it fails with something other
	// than "does not exist", which must not be mistaken for "no module
	// support".
	root := writeTree(t, map[string]string{osreleasePath: "6.6.0\n", "/proc/modules/x": ""})
	_, err := (&Kernel{Root: root}).Modules(context.Background())
	if err == nil || errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Modules() error = %v, want a read error", err)
	}
}

// hungModprobe is an exec.Interface whose `modprobe -- ip_vs` never ends
// on its own: it returns, as a killed process, only when its context ends,
// as the real exec kills a command whose context is done. Other modules
// load at once.
type hungModprobe struct {
	calls []string
}

func (h *hungModprobe) Command(cmd string, args ...string) exec.Cmd {
	return h.CommandContext(context.Background(), cmd, args...)
}

func (h *hungModprobe) CommandContext(ctx context.Context, cmd string, args ...string) exec.Cmd {
	fc := &fakeexec.FakeCmd{}
	fc.CombinedOutputScript = []fakeexec.FakeAction{func() ([]byte, []byte, error) {
		h.calls = append(h.calls, args[len(args)-1])
		if args[len(args)-1] != "ip_vs" {
			return nil, nil, nil
		}
		<-ctx.Done()
		return nil, nil, errors.New("signal: killed")
	}}
	return fakeexec.InitFakeCmd(fc, cmd, args...)
}

func (h *hungModprobe) LookPath(file string) (string, error) { return "/usr/sbin/" + file, nil }

// TestEnsureModulesHungModprobe checks that a modprobe that never returns
// is killed after Kernel.ModprobeTimeout, that its module then counts as
// missing, and that the modules after it are still loaded.
func TestEnsureModulesHungModprobe(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	h := &hungModprobe{}
	k := &Kernel{Root: writeTree(t, layoutDebianCloud(t)), Exec: h, ModprobeTimeout: 20 * time.Millisecond}
	loaded, err := k.EnsureModules(ctx, "ip_vs", "ip_set")
	var me *MissingModulesError
	if !errors.As(err, &me) {
		t.Fatalf("EnsureModules: %v, want a MissingModulesError", err)
	}
	if diff := cmp.Diff([]string{"ip_vs"}, me.Modules); diff != "" {
		t.Errorf("missing (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"ip_set"}, loaded); diff != "" {
		t.Errorf("loaded (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"ip_vs", "ip_set"}, h.calls); diff != "" {
		t.Errorf("modprobe calls (-want +got):\n%s", diff)
	}

	_, err = k.modprobe(ctx, "ip_vs")
	if err == nil || !strings.Contains(err.Error(), "timed out after 20ms") {
		t.Errorf("modprobe error %v, want one saying it timed out after 20ms", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := k.modprobe(cancelled, "ip_vs"); err == nil || strings.Contains(err.Error(), "timed out") {
		t.Errorf("modprobe cancelled by the caller: error %v, want one that is not a timeout", err)
	}
}
