package nftables

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// elementsPerMessage bounds the elements of one NEWSETELEM message: their
// list is one netlink attribute, whose length is 16 bits.
const elementsPerMessage = 512

// ApplyElements adds elements, SyncResult.Elements of a split full sync,
// to their sets and maps in the kernel through nf_tables netlink, as one
// batch: the kernel applies all of them or none. It talks to the network
// namespace of the calling thread. Each element must name its family and
// table, as the Writer's do. It fails before sending anything if an
// element is not one the Writer splits off, and with the kernel's error if
// the batch is refused (an element that exists with another value, a set
// that does not exist). No elements is no batch and no error.
func ApplyElements(elements []*knftables.Element) error {
	if len(elements) == 0 {
		return nil
	}
	type setID struct {
		family knftables.Family
		table  string
		name   string
	}
	sets := map[setID]*nftables.Set{}
	var order []setID
	byset := map[setID][]nftables.SetElement{}
	for _, el := range elements {
		enc, err := encodeElement(el)
		if err != nil {
			return err
		}
		if el.Table == "" {
			return fmt.Errorf("element %v of %s names no table", el.Key, el.Set+el.Map)
		}
		id := setID{el.Family, el.Table, el.Set + el.Map}
		if sets[id] == nil {
			fam := nftables.TableFamilyIPv4
			if el.Family == knftables.IPv6Family {
				fam = nftables.TableFamilyIPv6
			}
			sets[id] = &nftables.Set{Table: &nftables.Table{Family: fam, Name: el.Table}, Name: id.name, IsMap: el.Map != ""}
			order = append(order, id)
		}
		se := nftables.SetElement{Key: enc.key, Val: enc.value}
		if enc.chain != "" {
			se.VerdictData = &expr.Verdict{Kind: expr.VerdictGoto, Chain: enc.chain}
		}
		byset[id] = append(byset[id], se)
	}
	conn, err := nftables.New(nftables.WithSockOptions(bigBuffers))
	if err != nil {
		return fmt.Errorf("nftables netlink: %w", err)
	}
	for _, id := range order {
		elems := byset[id]
		for len(elems) > 0 {
			n := min(len(elems), elementsPerMessage)
			if err := conn.SetAddElements(sets[id], elems[:n]); err != nil {
				return fmt.Errorf("nftables netlink: elements of %s %s %s: %w", id.family, id.table, id.name, err)
			}
			elems = elems[n:]
		}
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("nftables netlink: adding %d elements: %w", len(elements), err)
	}
	return nil
}

// bigBuffers lets one batch carry a whole table's elements: google/nftables
// sends a batch in one sendmsg, which the kernel refuses (EMSGSIZE) beyond
// the socket's send buffer, and reads an acknowledgement per message, which
// the kernel queues at once and drops (ENOBUFS) beyond the receive buffer.
// The FORCE options pass the sysctl caps, for a process with
// CAP_NET_ADMIN, which changing nf_tables needs anyway. Buffers are
// accounted as used, not reserved.
func bigBuffers(c *netlink.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var sockErr error
	if err := raw.Control(func(fd uintptr) {
		for _, opt := range []int{unix.SO_SNDBUFFORCE, unix.SO_RCVBUFFORCE} {
			if sockErr == nil {
				sockErr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, 1<<30)
			}
		}
	}); err != nil {
		return err
	}
	if sockErr != nil {
		return fmt.Errorf("nftables netlink: socket buffers: %w", sockErr)
	}
	return nil
}
