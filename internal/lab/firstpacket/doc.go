// Package firstpacket measures what the service rules cost a connection's
// first packet: new TCP connections per second through a node namespace
// that holds the rules of N services, to the service that sorts first and
// the one that sorts last, for the nftables writer and the iptables writer
// (legacy and nft backends). iptables matches a new connection against
// KUBE-SERVICES rule by rule, in the writer's sorted order, so the last
// service pays for every rule before it; the nftables writer's layout
// looks the destination up in one verdict map whatever N is.
//
// The package has only tests: TestFirstPacketReach (N = 10, runs in CI
// with the kernel tests) checks that connections to both services reach
// their own backends through each writer's rules, and that the services
// sort as the measurement assumes; TestFirstPacket measures, only with
// PROXYKIT_NFT_BENCH=1:
//
//	PROXYKIT_NFT_BENCH=1 PROXYKIT_REQUIRE_KERNEL=1 go test ./internal/lab/firstpacket -run 'TestFirstPacket$' -count 1 -v -timeout 30m
package firstpacket
