package iptables

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/proxykit/proxykit/proxy"
)

// The names of kube-proxy's nfacct counters (extended accounting objects,
// which iptables rules count packets in with "-m nfacct --nfacct-name"),
// which its iptables mode creates and exports as metrics.
const (
	// NFAcctInvalidDropped counts the packets KUBE-FORWARD drops because
	// conntrack marked them INVALID.
	NFAcctInvalidDropped = "ct_state_invalid_dropped_pkts"
	// NFAcctLocalhostNodePorts counts the packets to a node port on an
	// IPv4 loopback address that the node-port rules accept.
	NFAcctLocalhostNodePorts = "localhost_nps_accepted_pkts"
)

// NFAcctNameMax is the longest name of an nfacct counter the kernel takes,
// in bytes.
const NFAcctNameMax = 31

// Accounting says which of kube-proxy's nfacct counters a Writer's rules
// count packets in; see Writer.SetAccounting.
type Accounting struct {
	// InvalidDropped counts in NFAcctInvalidDropped.
	InvalidDropped bool
	// LocalhostNodePorts counts in NFAcctLocalhostNodePorts.
	LocalhostNodePorts bool
}

// NFAcctCounter is an nfacct counter's values.
type NFAcctCounter struct {
	Name           string
	Packets, Bytes uint64
}

// NFAcct is the kernel's nfacct counters of one network namespace (they
// are shared by the IP families), over netlink; NewNFAcct makes the real
// one. Its methods are safe for concurrent use.
type NFAcct interface {
	// Ensure creates the counter name, unless it exists, whose values it
	// then leaves as they are.
	Ensure(ctx context.Context, name string) error
	// Get returns the counter name's values; an error for which
	// IsNotFound is true when it does not exist.
	Get(ctx context.Context, name string) (NFAcctCounter, error)
}

// ErrNFAcctNotFound is wrapped by NFAcct.Get's error for a missing
// counter; test for it with IsNotFound. A fake NFAcct wraps it too.
var ErrNFAcctNotFound = errors.New("nfacct counter does not exist")

// checkNFAcctName refuses a name the kernel would refuse.
func checkNFAcctName(name string) error {
	if name == "" || len(name) > NFAcctNameMax {
		return fmt.Errorf("nfacct counter name %q: must be 1 to %d bytes", name, NFAcctNameMax)
	}
	return nil
}

// nfacctCollector exports one nfacct counter's packets as a counter
// without labels, read at each scrape, as kube-proxy does; a scrape that
// cannot read it (the counter is not made yet, say) leaves it out.
type nfacctCollector struct {
	acct NFAcct
	name string
	desc *prometheus.Desc
	log  klog.Logger
}

var _ prometheus.Collector = (*nfacctCollector)(nil)

// Describe is part of prometheus.Collector.
func (c *nfacctCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect is part of prometheus.Collector.
func (c *nfacctCollector) Collect(ch chan<- prometheus.Metric) {
	v, err := c.acct.Get(context.Background(), c.name)
	if err != nil {
		c.log.Error(err, "Reading an nfacct counter for its metric", "counter", c.name)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(v.Packets))
}

// registerNFAcctMetrics registers the collectors of kube-proxy's two
// nfacct counters on m, once per name.
func registerNFAcctMetrics(log klog.Logger, m *proxy.Metrics, acct NFAcct) error {
	for _, c := range []struct{ metric, counter, help string }{
		{"kubeproxy_iptables_ct_state_invalid_dropped_packets_total", NFAcctInvalidDropped,
			"Packets that KUBE-FORWARD dropped because conntrack marked them INVALID."},
		{"kubeproxy_iptables_localhost_nodeports_accepted_packets_total", NFAcctLocalhostNodePorts,
			"Packets to node ports on IPv4 loopback addresses that the node-port rules accepted."},
	} {
		col := &nfacctCollector{acct: acct, name: c.counter, desc: prometheus.NewDesc(c.metric, c.help, nil, nil), log: log}
		if err := m.Collector(c.metric, col); err != nil {
			return err
		}
	}
	return nil
}

// ensureCounters makes kube-proxy's nfacct counters and says which exist.
// It clears ensureAcct once both do.
func (b *Mode) ensureCounters(ctx context.Context) Accounting {
	var a Accounting
	for _, c := range []struct {
		name string
		ok   *bool
	}{{NFAcctInvalidDropped, &a.InvalidDropped}, {NFAcctLocalhostNodePorts, &a.LocalhostNodePorts}} {
		if err := b.acct.Ensure(ctx, c.name); err != nil {
			klog.FromContext(ctx).Error(err, "Making an nfacct counter; rules will not count packets in it", "counter", c.name)
			continue
		}
		*c.ok = true
	}
	b.ensureAcct = !a.InvalidDropped || !a.LocalhostNodePorts
	return a
}
