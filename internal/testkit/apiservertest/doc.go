// Package apiservertest runs a real control plane for proxykit's API server
// test tier: an etcd and one or more kube-apiservers, built from the
// Kubernetes release of proxykit's k8s.io dependencies by
// hack/apiserver/build.sh, inside a network namespace of
// [github.com/proxykit/proxykit/internal/testkit/kerneltest]. The same build
// holds that release's kube-proxy ([KubeProxy]), for the tests that run it
// beside proxykit's proxier against one API server.
//
// A fake clientset has no resource versions that expire, no 410 Gone, no
// server-side selectors, admission or validation; this package is for the
// tests that need those: a proxier run with --kubeconfig against a real API
// server, and the faults only a real server has (a restart, a compaction
// that expires a watch, a stall).
//
//	bin := apiservertest.Require(t) // skips (or fails, in CI) without root or binaries
//	cp := kerneltest.NewNS(t)
//	kerneltest.Link(t, node, cp, netip.MustParsePrefix("10.2.0.1/24"), netip.MustParsePrefix("10.2.0.2/24"))
//	c := apiservertest.Start(t, cp, bin, apiservertest.Config{APIServers: []netip.Addr{netip.MustParseAddr("10.2.0.2")}})
//	kubeconfig := c.APIServer(0).Kubeconfig(t) // for the proxier, in the node namespace
//	c.Client().CoreV1().Services("default").Create(...)
//
// Nothing listens in the test process's own namespace: etcd serves only the
// loopback of the cluster's namespace, the API servers the addresses they
// are given there, and the test's own clients dial from inside it. The
// certificates and the service account key are made for each cluster and
// removed with it. This package is internal: its API changes with
// proxykit's tests.
package apiservertest
