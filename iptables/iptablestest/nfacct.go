package iptablestest

import (
	"context"
	"fmt"
	"sync"

	"github.com/proxykit/proxykit/iptables"
)

// NFAcct is an in-memory fake of iptables.NFAcct. Its counters count
// only what a test adds (rules do not reach it), and Ensure fails for the
// names given to Refuse, as it would on a kernel that refuses them.
type NFAcct struct {
	mu       sync.Mutex
	counters map[string]iptables.NFAcctCounter
	refuse   map[string]bool
}

var _ iptables.NFAcct = (*NFAcct)(nil)

// NewNFAcct returns an NFAcct with no counters.
func NewNFAcct() *NFAcct {
	return &NFAcct{counters: map[string]iptables.NFAcctCounter{}, refuse: map[string]bool{}}
}

// Ensure is part of iptables.NFAcct. It refuses a name the kernel would
// refuse (empty, or longer than iptables.NFAcctNameMax).
func (f *NFAcct) Ensure(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if name == "" || len(name) > iptables.NFAcctNameMax {
		return fmt.Errorf("nfacct fake: name %q: must be 1 to %d bytes", name, iptables.NFAcctNameMax)
	}
	if f.refuse[name] {
		return fmt.Errorf("nfacct fake: creating counter %s refused", name)
	}
	if _, ok := f.counters[name]; !ok {
		f.counters[name] = iptables.NFAcctCounter{Name: name}
	}
	return nil
}

// Get is part of iptables.NFAcct. A missing counter's error wraps
// iptables.ErrNFAcctNotFound.
func (f *NFAcct) Get(_ context.Context, name string) (iptables.NFAcctCounter, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.counters[name]
	if !ok {
		return iptables.NFAcctCounter{}, fmt.Errorf("nfacct fake: counter %s: %w", name, iptables.ErrNFAcctNotFound)
	}
	return c, nil
}

// Refuse makes Ensure of name fail (on) or work again (off).
func (f *NFAcct) Refuse(name string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refuse[name] = on
}

// Count adds packets and bytes to the counter name, which must exist; it
// reports whether it does.
func (f *NFAcct) Count(name string, packets, bytes uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.counters[name]
	if ok {
		c.Packets += packets
		c.Bytes += bytes
		f.counters[name] = c
	}
	return ok
}
