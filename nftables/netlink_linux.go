package nftables

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"sigs.k8s.io/knftables"

	"github.com/proxykit/proxykit/internal/netlinkbuf"
)

// elementsPerMessage bounds the elements of one NEWSETELEM message: their
// list is one netlink attribute, whose length is 16 bits.
const elementsPerMessage = 512

// ApplyElementBatch sends b to the kernel through nf_tables netlink as one
// batch, which the kernel commits whole or not at all: first every
// deletion (by key), then every addition, in that order, as a Writer's
// transaction orders them. It talks to the network namespace of the
// calling thread, and commits one batch (one nf_tables generation) when it
// succeeds. Each element must name its family and table, as the Writer's
// do, and be one netlinkElement takes (a set or map of the Writer's bulk,
// no comment). It fails before sending anything if one is not, and with
// the kernel's error, having changed nothing, if the kernel refuses the
// batch: a deletion of an element that is not there, an addition whose
// key is there with another value, a set, table or chain that does not
// exist. An empty batch is not sent and is no error. It waits for the
// kernel's acknowledgements at most DefaultCommandTimeout (Netlink sets
// another bound), then fails with an error for which IsCommandTimeout is
// true, not knowing whether the batch was committed.
func ApplyElementBatch(b ElementBatch) error {
	return Netlink{}.ApplyElementBatch(b)
}

// applyElementBatch is ApplyElementBatch bounded by timeout (zero: no
// bound); tests add socket options after the package's own.
func applyElementBatch(b ElementBatch, timeout time.Duration, testOpts ...nftables.SockOption) error {
	if b.Len() == 0 {
		return nil
	}
	type group struct {
		set   *nftables.Set
		elems []nftables.SetElement
	}
	sets := map[setID]*nftables.Set{}
	// groups collects one operation's elements by set, in the order the
	// sets first appear.
	groups := func(elements []*knftables.Element, keyOnly bool) ([]*group, error) {
		var out []*group
		index := map[setID]*group{}
		for _, el := range elements {
			var enc encodedElement
			var err error
			if keyOnly {
				enc.key, err = encodeKey(el)
			} else {
				enc, err = encodeElement(el)
			}
			if err != nil {
				return nil, err
			}
			if el.Table == "" {
				return nil, fmt.Errorf("element %v of %s names no table", el.Key, el.Set+el.Map)
			}
			id := setID{el.Family, el.Table, el.Set + el.Map}
			if sets[id] == nil {
				fam := nftables.TableFamilyIPv4
				if el.Family == knftables.IPv6Family {
					fam = nftables.TableFamilyIPv6
				}
				sets[id] = &nftables.Set{Table: &nftables.Table{Family: fam, Name: el.Table}, Name: id.name, IsMap: el.Map != ""}
			}
			g := index[id]
			if g == nil {
				g = &group{set: sets[id]}
				index[id] = g
				out = append(out, g)
			}
			se := nftables.SetElement{Key: enc.key, Val: enc.value}
			if enc.chain != "" {
				se.VerdictData = &expr.Verdict{Kind: expr.VerdictGoto, Chain: enc.chain}
			}
			g.elems = append(g.elems, se)
		}
		return out, nil
	}
	dels, err := groups(b.Delete, true)
	if err != nil {
		return err
	}
	adds, err := groups(b.Add, false)
	if err != nil {
		return err
	}
	// A lasting connection, so that Flush does not close the socket: see
	// closeInBackground.
	// The deadline bounds the sending and the acknowledgements: a batch
	// takes no longer to queue than to send.
	opts := append([]nftables.SockOption{bigBuffers, deadline(timeout)}, testOpts...)
	conn, err := nftables.New(nftables.AsLasting(), nftables.WithSockOptions(opts...))
	if err != nil {
		return fmt.Errorf("nftables netlink: %w", err)
	}
	defer closeInBackground(conn)
	for _, op := range []struct {
		verb   string
		groups []*group
		queue  func(*nftables.Set, []nftables.SetElement) error
	}{
		{"deleting", dels, conn.SetDeleteElements},
		{"adding", adds, conn.SetAddElements},
	} {
		for _, g := range op.groups {
			elems := g.elems
			for len(elems) > 0 {
				n := min(len(elems), elementsPerMessage)
				if err := op.queue(g.set, elems[:n]); err != nil {
					return fmt.Errorf("nftables netlink: %s elements of %s %s %s: %w", op.verb, familyName(g.set), g.set.Table.Name, g.set.Name, err)
				}
				elems = elems[n:]
			}
		}
	}
	if err := conn.Flush(); err != nil {
		what := fmt.Sprintf("deleting %d and adding %d elements", len(b.Delete), len(b.Add))
		if timeout > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
			// Flush joins the error of every message still unanswered
			// after the deadline: one says it.
			return requestError(what, os.ErrDeadlineExceeded, timeout)
		}
		return fmt.Errorf("nftables netlink: %s: %w", what, err)
	}
	return nil
}

// deadline sets a socket's deadline timeout from now; zero sets none.
func deadline(timeout time.Duration) nftables.SockOption {
	return func(c *netlink.Conn) error {
		if timeout <= 0 {
			return nil
		}
		if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
			return fmt.Errorf("nftables netlink: %w", err)
		}
		return nil
	}
}

// closeInBackground closes conn's socket without waiting for the close.
// Releasing a netfilter netlink socket makes the kernel wait for
// nf_tables' release of what earlier batches deleted, an RCU grace period
// (nft_rcv_nl_event flushes the destroy work on every release), which
// lasts many times longer than the batch takes to commit, and is the
// whole cost of nft -f's deletions beyond its exec. The batch is
// committed once Flush has read its acknowledgements,
// so nothing waits for the close but the next batch of the namespace,
// should it come within the grace period (the kernel holds nf_tables'
// commit lock meanwhile).
func closeInBackground(conn *nftables.Conn) {
	go func() { _ = conn.CloseLasting() }()
}

// familyName is the nft family of s's table, for errors.
func familyName(s *nftables.Set) knftables.Family {
	if s.Table.Family == nftables.TableFamilyIPv6 {
		return knftables.IPv6Family
	}
	return knftables.IPv4Family
}

// bigBuffers lets one batch carry a whole table's elements: google/nftables
// sends a batch in one sendmsg, which the kernel refuses (EMSGSIZE) beyond
// the socket's send buffer, and reads an acknowledgement per message, which
// the kernel queues at once and drops (ENOBUFS) beyond the receive buffer.
func bigBuffers(c *netlink.Conn) error {
	if err := netlinkbuf.Force(c, 1<<30, 1<<30); err != nil {
		return fmt.Errorf("nftables netlink: %w", err)
	}
	return nil
}
