package conntrack

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"time"

	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/kernel"
)

// The sysctls and module parameter Tune sets.
const (
	sysctlMax              = "net/netfilter/nf_conntrack_max"
	sysctlTCPEstablished   = "net/netfilter/nf_conntrack_tcp_timeout_established"
	sysctlTCPCloseWait     = "net/netfilter/nf_conntrack_tcp_timeout_close_wait"
	sysctlTCPBeLiberal     = "net/netfilter/nf_conntrack_tcp_be_liberal"
	sysctlUDPTimeout       = "net/netfilter/nf_conntrack_udp_timeout"
	sysctlUDPStreamTimeout = "net/netfilter/nf_conntrack_udp_timeout_stream"
)

// Tuning is what [Tune] sets, with kube-proxy's --conntrack-* meanings. A
// zero field leaves that setting as the kernel has it.
type Tuning struct {
	// MaxPerCore sets nf_conntrack_max to MaxPerCore times the number of
	// online CPUs, but not below Min. Zero leaves nf_conntrack_max (and
	// the hash size) alone, whatever Min says.
	MaxPerCore int
	// Min is the floor for nf_conntrack_max when MaxPerCore is set.
	Min int
	// TCPEstablishedTimeout sets nf_conntrack_tcp_timeout_established.
	TCPEstablishedTimeout time.Duration
	// TCPCloseWaitTimeout sets nf_conntrack_tcp_timeout_close_wait.
	TCPCloseWaitTimeout time.Duration
	// TCPBeLiberal, when true, sets nf_conntrack_tcp_be_liberal to 1, so
	// that out-of-window TCP packets are not marked INVALID (and dropped
	// or left un-NATed).
	TCPBeLiberal bool
	// UDPTimeout sets nf_conntrack_udp_timeout.
	UDPTimeout time.Duration
	// UDPStreamTimeout sets nf_conntrack_udp_timeout_stream.
	UDPStreamTimeout time.Duration
}

// Tune applies t through k's sysctl helpers, writing only values that
// differ from the current ones. Timeouts are rounded down to whole
// seconds; one that rounds to 0 is left alone.
//
// When nf_conntrack_max is set, the hash size
// (/sys/module/nf_conntrack/parameters/hashsize) is raised to a quarter of
// it if it is smaller, as the kernel's own default ratio; it is never
// lowered. If /sys is read-only (as container runtimes mount it unless told
// otherwise), or /proc/sys is, the error wraps kernel.ErrReadOnly: test it
// with kernel.IsReadOnly, and read the message for which mount refused.
// The rest of the tuning is still applied; a caller may treat a read-only
// /sys as a warning.
//
// Every setting is tried even if another fails; the errors are joined.
// Note that in a network namespace other than the host's, nf_conntrack_max
// is read-only and the hash size cannot be changed: both fail there.
func Tune(ctx context.Context, k *kernel.Kernel, t Tuning) error {
	var errs []error
	if t.MaxPerCore > 0 {
		if err := setMax(ctx, k, conntrackMax(ctx, k, t)); err != nil {
			errs = append(errs, err)
		}
	}
	for _, s := range []struct {
		name  string
		value time.Duration
	}{
		{sysctlTCPEstablished, t.TCPEstablishedTimeout},
		{sysctlTCPCloseWait, t.TCPCloseWaitTimeout},
		{sysctlUDPTimeout, t.UDPTimeout},
		{sysctlUDPStreamTimeout, t.UDPStreamTimeout},
	} {
		if secs := int(s.value / time.Second); secs > 0 {
			if err := ensure(ctx, k, s.name, secs); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if t.TCPBeLiberal {
		if err := ensure(ctx, k, sysctlTCPBeLiberal, 1); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// conntrackMax returns MaxPerCore × CPUs, at least Min. CPUs are counted
// from /sys (all online CPUs of the node) and, failing that, by the Go
// runtime (those this process may use).
func conntrackMax(ctx context.Context, k *kernel.Kernel, t Tuning) int {
	cpus, err := k.OnlineCPUs()
	if err != nil || cpus < 1 {
		klog.FromContext(ctx).V(2).Info("Counting CPUs from the Go runtime", "err", err)
		cpus = runtime.NumCPU()
	}
	return max(t.MaxPerCore*cpus, t.Min)
}

// setMax sets nf_conntrack_max and raises the hash size to max/4 if needed.
func setMax(ctx context.Context, k *kernel.Kernel, maxEntries int) error {
	var errs []error
	if err := ensure(ctx, k, sysctlMax, maxEntries); err != nil {
		errs = append(errs, err)
	}
	want := maxEntries / 4
	cur, err := k.ReadModuleParameter("nf_conntrack", "hashsize")
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("conntrack hash size: %w", err))...)
	}
	size, err := strconv.Atoi(cur)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("conntrack hash size %q: %w", cur, err))...)
	}
	if size >= want {
		return errors.Join(errs...)
	}
	klog.FromContext(ctx).Info("Raising conntrack hash size", "from", size, "to", want)
	err = k.WriteModuleParameter(ctx, "nf_conntrack", "hashsize", strconv.Itoa(want))
	if err != nil {
		err = fmt.Errorf("conntrack hash size %d: %w", want, err)
	}
	return errors.Join(append(errs, err)...)
}

func ensure(ctx context.Context, k *kernel.Kernel, name string, value int) error {
	changed, err := k.EnsureSysctlInt(ctx, name, value)
	if err != nil {
		return fmt.Errorf("setting %s to %d: %w", name, value, err)
	}
	if changed {
		klog.FromContext(ctx).Info("Set conntrack sysctl", "name", name, "value", value)
	}
	return nil
}
