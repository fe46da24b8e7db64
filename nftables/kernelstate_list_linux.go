package nftables

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// dialFamily returns the nfproto of family and a new socket, which the
// caller closes.
func (s *netlinkState) dialFamily(family knftables.Family) (byte, *netlink.Conn, error) {
	fam, err := nfproto(family)
	if err != nil {
		return 0, nil, err
	}
	conn, err := s.dial()
	if err != nil {
		return 0, nil, err
	}
	return fam, conn, nil
}

// Sets lists the table's sets and maps with one dump of its sets (a
// message per set, whatever their elements), leaving out the anonymous
// ones nft makes for a rule's literal set or verdict map.
func (s *netlinkState) Sets(family knftables.Family, table string) (map[string]bool, error) {
	fam, conn, err := s.dialFamily(family)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_TABLE, table)
	msgs, err := s.execute(conn, unix.NFT_MSG_GETSET, netlink.Dump, fam, ae, fmt.Sprintf("listing the sets of %s %s", family, table))
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("table %s %s: %w", family, table, ErrTableNotFound)
		}
		return nil, err
	}
	sets := map[string]bool{}
	for _, m := range msgs {
		if attrString(m.Data, unix.NFTA_SET_TABLE) != table {
			continue
		}
		var flags uint32
		if v, ok := attr(m.Data, unix.NFTA_SET_FLAGS); ok && len(v) == 4 {
			flags = binary.BigEndian.Uint32(v)
		}
		if flags&unix.NFT_SET_ANONYMOUS != 0 {
			continue
		}
		sets[attrString(m.Data, unix.NFTA_SET_NAME)] = flags&unix.NFT_SET_MAP != 0
	}
	return sets, nil
}

// ElementKeys dumps the set's elements and decodes their keys. The dump
// costs the kernel more than CheckElements' lookups of as many keys (it
// walks the set from its start for every message it fills), which is why
// the writer dumps only a set whose contents it cannot otherwise vouch
// for.
func (s *netlinkState) ElementKeys(family knftables.Family, table, set string) ([]string, error) {
	spec, ok := checkSets[set]
	if !ok {
		return nil, fmt.Errorf("nftables netlink: elements of %s cannot be decoded", set)
	}
	fam, conn, err := s.dialFamily(family)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, table)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
	msgs, err := s.execute(conn, unix.NFT_MSG_GETSETELEM, netlink.Dump, fam, ae, fmt.Sprintf("listing the elements of %s %s %s", family, table, set))
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, m := range msgs {
		list, ok := attr(m.Data, unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		if !ok {
			continue
		}
		k, ok := elementKeys(list, spec.key, fam == unix.NFPROTO_IPV6)
		if !ok {
			return nil, fmt.Errorf("nftables netlink: an element of %s %s %s has a key that does not decode", family, table, set)
		}
		keys = append(keys, k...)
	}
	return keys, nil
}
