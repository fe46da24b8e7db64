package nftables

import (
	"encoding/binary"
	"fmt"

	"sigs.k8s.io/knftables"
)

// The nf_tables netlink constants of an element batch (linux/netlink.h,
// linux/netfilter/nfnetlink.h and nf_tables.h), written out so that the
// encoding builds on every system, as the Writer does.
const (
	nfnlSubsysNFTables = 10
	nftMsgNewSetElem   = 12
	nftMsgDelSetElem   = 14
	nfnlMsgBatchBegin  = 0x10
	nfnlMsgBatchEnd    = 0x11

	nlmFRequest = 0x1
	nlmFAck     = 0x4
	nlmFCreate  = 0x400

	nlaFNested = 0x8000

	// The attributes of a NEWSETELEM or DELSETELEM message, of each
	// element in its list, and of a data or verdict value.
	attrListTable    = 1
	attrListSet      = 2
	attrListElements = 3
	attrListSetID    = 4
	attrElemKey      = 1
	attrElemData     = 2
	attrDataValue    = 1
	attrDataVerdict  = 2
	attrVerdictCode  = 1
	attrVerdictChain = 2
	verdictGoto      = 0xfffffffc // NFT_GOTO, -4

	// elementsPerMessage bounds the elements of one NEWSETELEM message:
	// their list is one netlink attribute, whose length is 16 bits.
	elementsPerMessage = 512

	nlmsgHeaderLen = 16
	nfgenHeaderLen = 4
	// maxAttrLen bounds an attribute, whose length is 16 bits: the list
	// of a message's elements is one.
	maxAttrLen = 0xffff
)

// wireBatch is an element batch encoded as its netlink messages in one
// buffer: the batch's begin message, then each NEWSETELEM and DELSETELEM
// message, room left for its header (which MarshalBinary fills in and
// ApplyElementBatch's socket writes itself), then its data from its
// nfgenmsg header on; the end message is not in it.
type wireBatch struct {
	buf  []byte
	msgs []wireMsg
}

// wireMsg is one message of a wireBatch: its netlink type and flags, and
// where it lies in the buffer, its header's room included.
type wireMsg struct {
	typ, flags uint16
	start, end int
}

// setID names a set or map among all tables of both families: what
// ApplyElementBatch and CheckElements group elements by, one message or
// request per set.
type setID struct {
	family knftables.Family
	table  string
	name   string
}

// wireGroup is the elements of one operation on one set, in their order.
type wireGroup struct {
	id  setID
	els []*knftables.Element
}

// encodeBatch encodes b as nft 1.0.6's netlink requests and google/nftables
// do (the same bytes, which TestEncodeBatchAsGoogleNftables checks):
// deletions first, then additions, each operation's elements grouped by
// set in the order the sets first appear, at most elementsPerMessage to a
// message. It fails, before anything is sent, on an element that
// encodeElement refuses or that names no table.
func encodeBatch(b ElementBatch) (*wireBatch, error) {
	wb := &wireBatch{}
	// The size of the common element (a v4 endpoint with its value): one
	// allocation for most batches.
	wb.buf = make([]byte, 0, 72*b.Len()+256)
	wb.buf = appendBatchControl(wb.buf, nfnlMsgBatchBegin)
	for _, part := range []struct {
		els []*knftables.Element
		typ uint16
	}{{b.Delete, nftMsgDelSetElem}, {b.Add, nftMsgNewSetElem}} {
		groups, err := groupBySet(part.els)
		if err != nil {
			return nil, err
		}
		for _, g := range groups {
			if err := wb.appendGroup(g, part.typ); err != nil {
				return nil, err
			}
		}
	}
	return wb, nil
}

// groupBySet groups els by set, in the order the sets first appear. A batch
// names a handful of sets, so a slice searched in turn does.
func groupBySet(els []*knftables.Element) ([]wireGroup, error) {
	var groups []wireGroup
	for _, el := range els {
		if el.Table == "" {
			return nil, fmt.Errorf("element %v of %s names no table", el.Key, el.Set+el.Map)
		}
		id := setID{el.Family, el.Table, el.Set + el.Map}
		i := 0
		for i < len(groups) && groups[i].id != id {
			i++
		}
		if i == len(groups) {
			groups = append(groups, wireGroup{id: id})
		}
		groups[i].els = append(groups[i].els, el)
	}
	return groups, nil
}

// appendGroup appends the messages of one set's elements: a new message
// every elementsPerMessage elements, or sooner should the list's attribute
// outgrow its 16-bit length.
func (wb *wireBatch) appendGroup(g wireGroup, typ uint16) error {
	family := byte(2) // NFPROTO_IPV4
	if g.id.family == knftables.IPv6Family {
		family = 10 // NFPROTO_IPV6
	}
	del := typ == nftMsgDelSetElem
	for len(g.els) > 0 {
		start := len(wb.buf)
		wb.buf = append(wb.buf, make([]byte, nlmsgHeaderLen)...)
		wb.buf = append(wb.buf, family, 0, 0, 0)
		wb.buf = appendStringAttr(wb.buf, attrListSet, g.id.name)
		wb.buf = appendAttrHeader(wb.buf, attrListSetID, 4)
		wb.buf = append(wb.buf, 0, 0, 0, 0)
		wb.buf = appendStringAttr(wb.buf, attrListTable, g.id.table)
		list := len(wb.buf)
		wb.buf = appendAttrHeader(wb.buf, attrListElements|nlaFNested, 0)
		n := 0
		for n < len(g.els) && n < elementsPerMessage {
			before := len(wb.buf)
			var err error
			if wb.buf, err = appendElementAttr(wb.buf, uint16(n+1), g.els[n], del); err != nil {
				return err
			}
			if len(wb.buf)-list > maxAttrLen {
				if n == 0 {
					return fmt.Errorf("element %v of %s: too long for a netlink attribute", g.els[n].Key, g.id.name)
				}
				wb.buf = wb.buf[:before]
				break
			}
			n++
		}
		putAttrLen(wb.buf[list:], len(wb.buf)-list)
		wb.msgs = append(wb.msgs, wireMsg{typ: nfnlSubsysNFTables<<8 | typ, flags: nlmFRequest | nlmFAck | nlmFCreate, start: start, end: len(wb.buf)})
		g.els = g.els[n:]
	}
	return nil
}

// appendElementAttr appends el as the list's item index: its key and, for
// an addition to a map, its value or verdict. It checks el as
// encodeElement does (encodeKey for a deletion).
func appendElementAttr(b []byte, index uint16, el *knftables.Element, keyOnly bool) ([]byte, error) {
	spec, v6, err := elementLayout(el)
	if err != nil {
		return b, err
	}
	name := el.Set + el.Map
	item := len(b)
	b = appendAttrHeader(b, index|nlaFNested, 0)
	if b, err = appendDataAttr(b, attrElemKey, spec.key, el.Key, v6); err != nil {
		return b[:item], fmt.Errorf("element %v of %s: key: %w", el.Key, name, err)
	}
	switch {
	case keyOnly:
	case spec.verdict:
		chain, err := gotoChain(el)
		if err != nil {
			return b[:item], err
		}
		outer := len(b)
		b = appendAttrHeader(b, attrElemData|nlaFNested, 0)
		verdict := len(b)
		b = appendAttrHeader(b, attrDataVerdict|nlaFNested, 0)
		b = appendAttrHeader(b, attrVerdictCode, 4)
		b = binary.BigEndian.AppendUint32(b, verdictGoto)
		b = appendStringAttr(b, attrVerdictChain, chain)
		putAttrLen(b[verdict:], len(b)-verdict)
		putAttrLen(b[outer:], len(b)-outer)
	case spec.value != nil:
		if b, err = appendDataAttr(b, attrElemData, spec.value, el.Value, v6); err != nil {
			return b[:item], fmt.Errorf("element %v of %s: value: %w", el.Key, name, err)
		}
	}
	putAttrLen(b[item:], len(b)-item)
	return b, nil
}

// appendDataAttr appends the nested attribute typ holding parts as a data
// value, encoded as fields.
func appendDataAttr(b []byte, typ uint16, fields []field, parts []string, v6 bool) ([]byte, error) {
	outer := len(b)
	b = appendAttrHeader(b, typ|nlaFNested, 0)
	value := len(b)
	b = appendAttrHeader(b, attrDataValue, 0)
	b, err := appendFields(b, fields, parts, v6)
	if err != nil {
		return b, err
	}
	putAttrLen(b[value:], len(b)-value)
	b = pad(b)
	putAttrLen(b[outer:], len(b)-outer)
	return b, nil
}

// appendAttrHeader appends a netlink attribute's header, of length n bytes
// of data (patched later with putAttrLen when not known yet).
func appendAttrHeader(b []byte, typ uint16, n int) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(4+n))
	return binary.NativeEndian.AppendUint16(b, typ)
}

// putAttrLen sets the length of the attribute at the start of b to n bytes
// (its header included).
func putAttrLen(b []byte, n int) {
	binary.NativeEndian.PutUint16(b, uint16(n))
}

// appendStringAttr appends s as a NUL-terminated string attribute, padded.
func appendStringAttr(b []byte, typ uint16, s string) []byte {
	b = appendAttrHeader(b, typ, len(s)+1)
	b = append(append(b, s...), 0)
	return pad(b)
}

// pad pads b with zeros to netlink's 4-byte alignment.
func pad(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// MarshalBinary returns b as the netlink messages ApplyElementBatch sends
// for it, one after the other as one sendmsg carries them: the batch's
// begin message, its NEWSETELEM and DELSETELEM messages, its end message,
// with sequence numbers and port IDs zero (the socket sets them). It fails
// as ApplyElementBatch does before sending anything, and returns nothing
// for an empty batch, which ApplyElementBatch does not send. It is what
// reaches the kernel of a batch or of a split first load
// (ElementBatch{Add: SyncResult.Elements}), for a stand-in kernel or a
// measure of the bytes; the Writer's nft -f text is Transaction.String.
func (b ElementBatch) MarshalBinary() ([]byte, error) {
	if b.Len() == 0 {
		return nil, nil
	}
	wb, err := encodeBatch(b)
	if err != nil {
		return nil, err
	}
	for _, m := range wb.msgs {
		appendMsgHeader(wb.buf[m.start:m.start], m.typ, m.flags, m.end-m.start-nlmsgHeaderLen)
	}
	return appendBatchControl(wb.buf, nfnlMsgBatchEnd), nil
}

// batchControlData is the data of a batch's begin and end messages: an
// nfgenmsg for the nf_tables subsystem.
var batchControlData = [nfgenHeaderLen]byte{0, 0, 0, nfnlSubsysNFTables}

func appendBatchControl(b []byte, typ uint16) []byte {
	b = appendMsgHeader(b, typ, nlmFRequest, nfgenHeaderLen)
	return append(b, batchControlData[:]...)
}

// appendMsgHeader appends a netlink message header for n bytes of data.
func appendMsgHeader(b []byte, typ, flags uint16, n int) []byte {
	b = binary.NativeEndian.AppendUint32(b, uint32(nlmsgHeaderLen+n))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	return append(b, 0, 0, 0, 0, 0, 0, 0, 0)
}
