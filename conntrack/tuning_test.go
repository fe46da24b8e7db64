package conntrack_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2/ktesting"

	"github.com/proxykit/proxykit/conntrack"
	"github.com/proxykit/proxykit/kernel"
)

// tunables are the files Tune may touch, relative to the root, with the
// values of this test machine's kernel (6.18, 2 CPUs).
var tunables = map[string]string{
	"proc/sys/net/netfilter/nf_conntrack_max":                     "262144",
	"proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established": "432000",
	"proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait":  "60",
	"proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal":          "0",
	"proc/sys/net/netfilter/nf_conntrack_udp_timeout":             "30",
	"proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream":      "120",
	"sys/module/nf_conntrack/parameters/hashsize":                 "262144",
	"sys/devices/system/cpu/online":                               "0-1",
	"proc/mounts":                                                 "proc /proc proc rw,relatime 0 0\nsysfs /sys sysfs rw,relatime 0 0\n",
}

// fakeRoot writes tunables, with changes (a "" value removes the file),
// into a temp dir standing for "/". Tests never touch the host's /proc/sys
// or /sys: nf_conntrack_max is read-only outside the host namespace and
// the hash size is host-wide.
func fakeRoot(t *testing.T, changes map[string]string) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{}
	for p, v := range tunables {
		files[p] = v
	}
	for p, v := range changes {
		files[p] = v
	}
	for p, v := range files {
		if v == "" {
			continue
		}
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// readRoot returns the tunables' values under root ("" for a missing file).
func readRoot(t *testing.T, root string) map[string]string {
	t.Helper()
	got := map[string]string{}
	for p := range tunables {
		if p == "proc/mounts" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(root, p))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		got[p] = strings.TrimSpace(string(data))
	}
	return got
}

func TestTune(t *testing.T) {
	const (
		max     = "proc/sys/net/netfilter/nf_conntrack_max"
		hash    = "sys/module/nf_conntrack/parameters/hashsize"
		estab   = "proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established"
		close   = "proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait"
		liberal = "proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal"
		udpT    = "proc/sys/net/netfilter/nf_conntrack_udp_timeout"
		udpS    = "proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream"
		cpus    = "sys/devices/system/cpu/online"
	)
	// kube-proxy's defaults.
	defaults := conntrack.Tuning{
		MaxPerCore: 32768, Min: 131072,
		TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour,
	}
	for _, tc := range []struct {
		name         string
		changes      map[string]string
		tuning       conntrack.Tuning
		want         map[string]string // changed files only
		wantErr      bool
		wantReadOnly bool
	}{{
		name:   "zero tuning changes nothing",
		tuning: conntrack.Tuning{Min: 1 << 20},
		want:   map[string]string{},
	}, {
		name:   "kube-proxy defaults on 2 CPUs: the minimum wins, hash size already big enough",
		tuning: defaults,
		want:   map[string]string{max: "131072", estab: "86400", close: "3600"},
	}, {
		name:    "per-core value on 8 CPUs, hash size raised to max/4",
		changes: map[string]string{cpus: "0-7", hash: "16384"},
		tuning:  conntrack.Tuning{MaxPerCore: 65536, Min: 131072},
		want:    map[string]string{max: "524288", hash: "131072"},
	}, {
		name:    "hash size never lowered",
		changes: map[string]string{hash: "1048576"},
		tuning:  conntrack.Tuning{MaxPerCore: 65536},
		want:    map[string]string{max: "131072"},
	}, {
		name:   "udp timeouts, be_liberal, sub-second timeouts ignored",
		tuning: conntrack.Tuning{UDPTimeout: 60 * time.Second, UDPStreamTimeout: 3 * time.Minute, TCPBeLiberal: true, TCPCloseWaitTimeout: 500 * time.Millisecond},
		want:   map[string]string{udpT: "60", udpS: "180", liberal: "1"},
	}, {
		name:         "read-only /sys: its own error, everything else still set",
		changes:      map[string]string{"proc/mounts": "proc /proc proc rw 0 0\nsysfs /sys sysfs ro,nosuid,nodev,noexec 0 0\n", hash: "16384"},
		tuning:       conntrack.Tuning{MaxPerCore: 65536, Min: 131072, TCPEstablishedTimeout: 24 * time.Hour, UDPTimeout: time.Minute},
		want:         map[string]string{max: "131072", estab: "86400", udpT: "60"},
		wantErr:      true,
		wantReadOnly: true,
	}, {
		name:    "read-only /sys does not matter when the hash size is big enough",
		changes: map[string]string{"proc/mounts": "sysfs /sys sysfs ro 0 0\n"},
		tuning:  conntrack.Tuning{MaxPerCore: 65536},
		want:    map[string]string{max: "131072"},
	}, {
		name:         "read-only /proc/sys is read-only too",
		changes:      map[string]string{"proc/mounts": "proc /proc proc rw 0 0\nproc /proc/sys proc ro 0 0\n"},
		tuning:       defaults,
		want:         map[string]string{},
		wantErr:      true,
		wantReadOnly: true,
	}, {
		name:    "no conntrack (module not loaded): errors, nothing created",
		changes: map[string]string{max: "", hash: "", estab: "", close: ""},
		tuning:  defaults,
		want:    map[string]string{max: "", hash: "", estab: "", close: ""},
		wantErr: true,
	}, {
		name:    "CPU count falls back to the Go runtime",
		changes: map[string]string{cpus: ""},
		tuning:  conntrack.Tuning{MaxPerCore: 100000, Min: 12345},
		want:    map[string]string{max: strconv.Itoa(100000 * runtime.NumCPU()), cpus: ""},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			root := fakeRoot(t, tc.changes)
			before := readRoot(t, root)
			err := conntrack.Tune(ctx, &kernel.Kernel{Root: root}, tc.tuning)
			if (err != nil) != tc.wantErr {
				t.Errorf("Tune error = %v, want error %v", err, tc.wantErr)
			}
			if got := kernel.IsReadOnly(err); got != tc.wantReadOnly {
				t.Errorf("kernel.IsReadOnly(err) = %v, want %v (err: %v)", got, tc.wantReadOnly, err)
			}
			want := before
			for p, v := range tc.want {
				want[p] = v
			}
			if diff := cmp.Diff(want, readRoot(t, root)); diff != "" {
				t.Errorf("files after Tune (-want +got):\n%s", diff)
			}
		})
	}
}
