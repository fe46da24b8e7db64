// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * proxykit's socket load balancer: cgroup programs that translate a
 * Service frontend to one of its endpoints when a socket connects (TCP,
 * UDP; SCTP never runs them) or sends a datagram to it (UDP), and give the
 * Service address back to recvmsg and getpeername callers. The maps are
 * described in lb.h; policy (traffic policies, topology, which endpoints
 * are ready) is decided by whoever writes them, never here.
 */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "lb.h"

#define ECONNREFUSED 111
#define NSEC_PER_SEC 1000000000ULL

/* Returns of cgroup sock_addr programs. */
#define SYS_REJECT 0
#define SYS_PROCEED 1

/*
 * Map sizes here are defaults; the Go side sets each at load time. The
 * maps the writer fills take memory as they fill (BPF_F_NO_PREALLOC), so
 * that generous sizes cost nothing until used; LRU maps cannot.
 */
#define LB_MAP(name, type_, key_t, value_t, entries, flags) \
	struct {                                            \
		__uint(type, type_);                        \
		__type(key, key_t);                         \
		__type(value, value_t);                     \
		__uint(max_entries, entries);               \
		__uint(map_flags, flags);                   \
	} name SEC(".maps")

LB_MAP(lb4_services, BPF_MAP_TYPE_HASH, struct lb4_key, struct lb_service, 65536, BPF_F_NO_PREALLOC);
LB_MAP(lb4_slots, BPF_MAP_TYPE_HASH, struct lb_slot_key, __u32, 524288, BPF_F_NO_PREALLOC);
LB_MAP(lb4_endpoints, BPF_MAP_TYPE_HASH, __u32, struct lb4_endpoint, 524288, BPF_F_NO_PREALLOC);
LB_MAP(lb4_affinity, BPF_MAP_TYPE_LRU_HASH, struct lb_affinity_key, struct lb_affinity, 65536, 0);
LB_MAP(lb4_revnat, BPF_MAP_TYPE_LRU_HASH, struct lb4_revnat_key, struct lb4_revnat, 262144, 0);

LB_MAP(lb6_services, BPF_MAP_TYPE_HASH, struct lb6_key, struct lb_service, 65536, BPF_F_NO_PREALLOC);
LB_MAP(lb6_slots, BPF_MAP_TYPE_HASH, struct lb_slot_key, __u32, 524288, BPF_F_NO_PREALLOC);
LB_MAP(lb6_endpoints, BPF_MAP_TYPE_HASH, __u32, struct lb6_endpoint, 524288, BPF_F_NO_PREALLOC);
LB_MAP(lb6_affinity, BPF_MAP_TYPE_LRU_HASH, struct lb_affinity_key, struct lb_affinity, 65536, 0);
LB_MAP(lb6_revnat, BPF_MAP_TYPE_LRU_HASH, struct lb6_revnat_key, struct lb6_revnat, 262144, 0);

/*
 * pick returns the id of the endpoint of svc that the socket's connection
 * goes to, or 0 when the set has none to give. A live affinity entry of
 * the socket's namespace wins while its endpoint is still in the set
 * (an id freed and given to another set no longer matches the set);
 * otherwise a slot is drawn at random and, with affinity, remembered.
 */
static __always_inline __u32 pick(void *ctx, const struct lb_service *svc,
				  void *slots, void *affinity, void *endpoints)
{
	struct lb_affinity_key akey = {};
	struct lb_slot_key skey = {};
	__u64 now = 0;
	__u32 *id;

	if (svc->affinity_seconds) {
		struct lb_affinity *a;

		akey.netns = bpf_get_netns_cookie(ctx);
		akey.service = svc->id;
		now = bpf_ktime_get_ns();
		a = bpf_map_lookup_elem(affinity, &akey);
		if (a && now - a->last_used_ns <= (__u64)svc->affinity_seconds * NSEC_PER_SEC) {
			__u32 *owner = bpf_map_lookup_elem(endpoints, &a->endpoint);

			if (owner && *owner == svc->id) {
				a->last_used_ns = now;
				return a->endpoint;
			}
		}
	}

	skey.service = svc->id;
	skey.slot = bpf_get_prandom_u32() % svc->count;
	id = bpf_map_lookup_elem(slots, &skey);
	if (!id)
		return 0;
	if (svc->affinity_seconds) {
		struct lb_affinity a = { .last_used_ns = now, .endpoint = *id };

		bpf_map_update_elem(affinity, &akey, &a, BPF_ANY);
	}
	return *id;
}

/*
 * refuse makes connect(2) or sendmsg(2) fail with ECONNREFUSED, as
 * kube-proxy's REJECT of a Service without endpoints does.
 */
static __always_inline int refuse(void)
{
	bpf_set_retval(-ECONNREFUSED);
	return SYS_REJECT;
}

/*
 * lookup4 returns the endpoint an IPv4 frontend sends the socket to and
 * records the translation for recvmsg and getpeername, or returns NULL
 * to leave the socket alone, with *refused set when the frontend has no
 * endpoint. The IPv6 programs call it too, for IPv4-mapped addresses
 * (::ffff:a.b.c.d) of dual-stack sockets.
 */
static __always_inline struct lb4_endpoint *lookup4(void *ctx, __u32 addr, __u16 port,
						    __u8 proto, int *refused)
{
	struct lb4_key key = {};
	struct lb4_revnat_key rkey = {};
	struct lb4_revnat rval = {};
	struct lb4_endpoint *ep;
	struct lb_service *svc;
	__u32 id;

	key.addr = addr;
	key.port = port;
	key.proto = proto;
	svc = bpf_map_lookup_elem(&lb4_services, &key);
	if (!svc)
		return 0;
	if (!svc->count) {
		*refused = 1;
		return 0;
	}
	id = pick(ctx, svc, &lb4_slots, &lb4_affinity, &lb4_endpoints);
	ep = id ? bpf_map_lookup_elem(&lb4_endpoints, &id) : 0;
	/* A set being rewritten while we read it: leave the socket to the
	 * Service address, which a packet-level backend beside this one
	 * still serves, rather than fail a connection that would succeed. */
	if (!ep || ep->service != svc->id)
		return 0;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = ep->addr;
	rkey.port = ep->port;
	rval.addr = addr;
	rval.port = port;
	bpf_map_update_elem(&lb4_revnat, &rkey, &rval, BPF_ANY);
	return ep;
}

static __always_inline int xlate4(struct bpf_sock_addr *ctx)
{
	int refused = 0;
	struct lb4_endpoint *ep = lookup4(ctx, ctx->user_ip4, (__u16)ctx->user_port,
					  (__u8)ctx->protocol, &refused);

	if (refused)
		return refuse();
	if (ep) {
		ctx->user_ip4 = ep->addr;
		ctx->user_port = ep->port;
	}
	return SYS_PROCEED;
}

/* is_v4mapped reports whether an IPv6 address is ::ffff:a.b.c.d. */
static __always_inline int is_v4mapped(const __u32 *a)
{
	return a[0] == 0 && a[1] == 0 && a[2] == bpf_htonl(0xffff);
}

static __always_inline int xlate6(struct bpf_sock_addr *ctx)
{
	struct lb6_key key = {};
	struct lb6_revnat_key rkey = {};
	struct lb6_revnat rval = {};
	struct lb6_endpoint *ep;
	struct lb_service *svc;
	__u32 id;

	key.addr[0] = ctx->user_ip6[0];
	key.addr[1] = ctx->user_ip6[1];
	key.addr[2] = ctx->user_ip6[2];
	key.addr[3] = ctx->user_ip6[3];
	key.port = (__u16)ctx->user_port;
	key.proto = (__u8)ctx->protocol;
	if (is_v4mapped(key.addr)) {
		int refused = 0;
		struct lb4_endpoint *ep4 = lookup4(ctx, key.addr[3], key.port, key.proto, &refused);

		if (refused)
			return refuse();
		if (ep4) {
			ctx->user_ip6[3] = ep4->addr;
			ctx->user_port = ep4->port;
		}
		return SYS_PROCEED;
	}
	svc = bpf_map_lookup_elem(&lb6_services, &key);
	if (!svc)
		return SYS_PROCEED;
	if (!svc->count)
		return refuse();
	id = pick(ctx, svc, &lb6_slots, &lb6_affinity, &lb6_endpoints);
	ep = id ? bpf_map_lookup_elem(&lb6_endpoints, &id) : 0;
	if (!ep || ep->service != svc->id)
		return SYS_PROCEED;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	__builtin_memcpy(rkey.addr, ep->addr, sizeof(rkey.addr));
	rkey.port = ep->port;
	__builtin_memcpy(rval.addr, key.addr, sizeof(rval.addr));
	rval.port = key.port;
	bpf_map_update_elem(&lb6_revnat, &rkey, &rval, BPF_ANY);

	ctx->user_ip6[0] = ep->addr[0];
	ctx->user_ip6[1] = ep->addr[1];
	ctx->user_ip6[2] = ep->addr[2];
	ctx->user_ip6[3] = ep->addr[3];
	ctx->user_port = ep->port;
	return SYS_PROCEED;
}

/* restore4 and restore6 put the frontend back where the kernel reports
 * the endpoint a translated socket talks to. */
static __always_inline int restore4(struct bpf_sock_addr *ctx)
{
	struct lb4_revnat_key rkey = {};
	struct lb4_revnat *rval;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr = ctx->user_ip4;
	rkey.port = (__u16)ctx->user_port;
	rval = bpf_map_lookup_elem(&lb4_revnat, &rkey);
	if (rval) {
		ctx->user_ip4 = rval->addr;
		ctx->user_port = rval->port;
	}
	return SYS_PROCEED;
}

static __always_inline int restore6(struct bpf_sock_addr *ctx)
{
	struct lb6_revnat_key rkey = {};
	struct lb6_revnat *rval;

	rkey.cookie = bpf_get_socket_cookie(ctx);
	rkey.addr[0] = ctx->user_ip6[0];
	rkey.addr[1] = ctx->user_ip6[1];
	rkey.addr[2] = ctx->user_ip6[2];
	rkey.addr[3] = ctx->user_ip6[3];
	rkey.port = (__u16)ctx->user_port;
	if (is_v4mapped(rkey.addr)) {
		struct lb4_revnat_key rkey4 = {};
		struct lb4_revnat *rval4;

		rkey4.cookie = rkey.cookie;
		rkey4.addr = rkey.addr[3];
		rkey4.port = rkey.port;
		rval4 = bpf_map_lookup_elem(&lb4_revnat, &rkey4);
		if (rval4) {
			ctx->user_ip6[3] = rval4->addr;
			ctx->user_port = rval4->port;
		}
		return SYS_PROCEED;
	}
	rval = bpf_map_lookup_elem(&lb6_revnat, &rkey);
	if (rval) {
		ctx->user_ip6[0] = rval->addr[0];
		ctx->user_ip6[1] = rval->addr[1];
		ctx->user_ip6[2] = rval->addr[2];
		ctx->user_ip6[3] = rval->addr[3];
		ctx->user_port = rval->port;
	}
	return SYS_PROCEED;
}

SEC("cgroup/connect4")
int lb_connect4(struct bpf_sock_addr *ctx) { return xlate4(ctx); }

SEC("cgroup/sendmsg4")
int lb_sendmsg4(struct bpf_sock_addr *ctx) { return xlate4(ctx); }

SEC("cgroup/recvmsg4")
int lb_recvmsg4(struct bpf_sock_addr *ctx) { return restore4(ctx); }

SEC("cgroup/getpeername4")
int lb_getpeername4(struct bpf_sock_addr *ctx) { return restore4(ctx); }

SEC("cgroup/connect6")
int lb_connect6(struct bpf_sock_addr *ctx) { return xlate6(ctx); }

SEC("cgroup/sendmsg6")
int lb_sendmsg6(struct bpf_sock_addr *ctx) { return xlate6(ctx); }

SEC("cgroup/recvmsg6")
int lb_recvmsg6(struct bpf_sock_addr *ctx) { return restore6(ctx); }

SEC("cgroup/getpeername6")
int lb_getpeername6(struct bpf_sock_addr *ctx) { return restore6(ctx); }

char __license[] SEC("license") = "Dual BSD/GPL";
