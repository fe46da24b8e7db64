#!/usr/bin/env bash
# Installs the programs proxykit's kernel tests drive, when they are missing.
# The tests use iptables-restore/-save (legacy and nft), ipset and conntrack to
# cross-check what they program over netlink, iproute2 for `ip netns`, and nft
# (package nftables) for the nftables transport measurements.
# Without root nothing can be installed (and kernel tests will skip), so this
# only reports what is missing.
set -euo pipefail

need=()
for tool in iptables-legacy-restore iptables-nft-restore ip6tables-legacy-restore ipset conntrack ip nft; do
	command -v "$tool" >/dev/null 2>&1 || need+=("$tool")
done
if [ ${#need[@]} -eq 0 ]; then
	exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	echo "install-test-tools: missing ${need[*]}; kernel tests will skip (run as root on Debian/Ubuntu to install them)" >&2
	exit 0
fi
echo "install-test-tools: installing packages for ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends iptables ipset conntrack iproute2 nftables >/dev/null
