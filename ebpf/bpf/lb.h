/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * The maps of proxykit's socket load balancer: one header shared by the
 * cgroup programs in sock.c, by the Go side through bpf2go (which turns
 * each struct below into a Go type), and by a future tc/XDP program that
 * serves traffic from outside the node with the same maps.
 *
 * Keys have no implicit padding: the programs zero every key before
 * filling it, and a hash lookup compares all its bytes.
 *
 * Every address and port is in network byte order, as the kernel hands
 * them to the hooks. Each family has its own maps (lb4_*, lb6_*): the
 * keys stay small and a per-family program reads only its own.
 *
 * A Service frontend (an address, port and protocol that traffic is sent
 * to: a cluster IP, an external IP, a load-balancer VIP or a node port on
 * a node address) maps to a backend set: its id, how many endpoints it
 * has and its ClientIP affinity timeout. The set's endpoints sit in slots
 * 0..count-1 of the slot map, each naming an endpoint id, and the
 * endpoint map gives each id its address and port. Changing one endpoint
 * is a few element writes: its endpoint entry, one slot, and the count
 * in the set's frontends.
 */
#ifndef PROXYKIT_LB_H
#define PROXYKIT_LB_H

#include <linux/types.h>

/* Flags of a frontend, for readers (the tracer, a tc program); the cgroup
 * programs do not branch on them. */
#define LB_FLAG_EXTERNAL_IP 0x1 /* an external IP */
#define LB_FLAG_LOADBALANCER 0x2 /* a load-balancer VIP */
#define LB_FLAG_NODEPORT 0x4 /* a node port on a node address */

struct lb4_key {
	__u32 addr;
	__u16 port;
	__u8 proto; /* IPPROTO_TCP, IPPROTO_UDP or IPPROTO_SCTP */
	__u8 pad;
};

struct lb6_key {
	__u32 addr[4];
	__u16 port;
	__u8 proto;
	__u8 pad;
};

/* The value of a frontend: the backend set it sends to. */
struct lb_service {
	__u32 id; /* the backend set, never 0 */
	__u32 count; /* endpoints in slots 0..count-1; 0 refuses connections */
	__u32 affinity_seconds; /* ClientIP affinity timeout; 0 for none */
	__u16 flags; /* LB_FLAG_* */
	__u16 pad;
};

struct lb_slot_key {
	__u32 service; /* lb_service.id */
	__u32 slot;
};

/* An endpoint starts with the id of the set it belongs to, in both
 * families, so that code common to both can check it: an id freed and
 * given to another set must not keep an old affinity entry alive. */
struct lb4_endpoint {
	__u32 service;
	__u32 addr;
	__u16 port;
	__u16 pad;
};

struct lb6_endpoint {
	__u32 service;
	__u32 addr[4];
	__u16 port;
	__u16 pad;
};

/*
 * ClientIP affinity of a socket-level balancer is per network namespace:
 * every socket of a pod shares the pod's namespace and address, and the
 * host's sockets the node's, which is what a client IP is to kube-proxy.
 */
struct lb_affinity_key {
	__u64 netns; /* bpf_get_netns_cookie */
	__u32 service;
	__u32 pad;
};

struct lb_affinity {
	__u64 last_used_ns; /* bpf_ktime_get_ns of the last connection */
	__u32 endpoint;
	__u32 pad;
};

/* What a socket was translated to, so that recvmsg and getpeername give
 * its caller the Service address back. */
struct lb4_revnat_key {
	__u64 cookie; /* bpf_get_socket_cookie */
	__u32 addr; /* the endpoint */
	__u16 port;
	__u16 pad;
};

struct lb4_revnat {
	__u32 addr; /* the frontend */
	__u16 port;
	__u16 pad;
};

struct lb6_revnat_key {
	__u64 cookie;
	__u32 addr[4];
	__u16 port;
	__u16 pad;
	__u32 pad2; /* explicit, so that every byte of the key is set */
};

struct lb6_revnat {
	__u32 addr[4];
	__u16 port;
	__u16 pad;
};

#endif
