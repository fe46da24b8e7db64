// Package ipvs manages the kernel's IPVS load balancer over netlink, with
// no ipvsadm binary: virtual servers and their real servers
// ([Interface], over github.com/moby/ipvs, with batched writes of its own),
// the graceful termination of real servers that are going away
// ([GracefulTerminator]), the service addresses on the kube-ipvs0 dummy
// interface ([AddressBinder]), and a [Reconciler] that brings all three to
// a desired list of services with the fewest netlink writes.
//
// IPVS mode itself (the translation of the tracker's maps into virtual
// servers, ipsets and rules, and its Backend) is package
// github.com/proxykit/proxykit/ipvsmode, built on this one.
//
// It is what an IPVS-mode service proxier, or a kube-router-style load
// balancer, needs under its own sync loop. It is not the proxier: it does
// not watch the API, decide when to sync, or tune sysctls. It supports NAT
// ("masquerade") real servers on address, protocol and port virtual
// servers; firewall-mark virtual servers, tunnelling and direct routing are
// not supported. [New] refuses, with the list of missing modules, on a
// kernel that cannot run IPVS mode. The package ipvs/ipvstest has strict
// in-memory fakes of [Interface] and [AddressBinder].
//
// The smallest use of the kernel side, as root on a node with IPVS (see
// ipvsmode's Writer example for IPVS mode):
//
//	lb, err := ipvs.New(ctx) // checks the kernel first
//	if err != nil { ... }    // ipvs.IsNotSupported(err) on a kernel without IPVS
//	defer lb.Close()
//	addrs, err := ipvs.NewDummyBinder()
//	if err != nil { ... }
//	defer addrs.Close()
//	r := ipvs.NewReconciler(lb, addrs)
//	go r.Terminator().Run(ctx) // deletes drained real servers
//	_, err = r.Reconcile(ctx, []ipvs.Service{{
//		VirtualServer: ipvs.VirtualServer{Address: clusterIP, Protocol: v1.ProtocolTCP, Port: 443},
//		RealServers:   []ipvs.RealServer{{Address: podIP, Port: 6443, Weight: 1}},
//		Bind:          true,
//	}})
package ipvs
