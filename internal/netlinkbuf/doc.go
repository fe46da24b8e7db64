// Package netlinkbuf sizes a netlink socket's buffers past the sysctl
// caps, for the nf_tables code that sends or reads a whole table in one
// go: package nftables and the measurements of internal/lab/nftmeasure. It is
// not for sockets that carry a request at a time, whose default buffers
// hold them.
package netlinkbuf
