#!/bin/sh
# The API server tier as `make test` runs it: builds kube-apiserver, etcd and
# kube-proxy (or finds them in the cache; see build.sh) and prints their
# directory, for PROXYKIT_APISERVER_BIN. The tier's tests (TestAPIServer*)
# run in network namespaces, so only as root; elsewhere, or where the build
# fails, it is skipped with a message and prints nothing, and the tests skip
# with a reason. Under PROXYKIT_REQUIRE_KERNEL=1 (CI) a skip is a failure instead.
# PROXYKIT_SKIP_APISERVER=1 skips the tier on purpose, to spare a machine
# the cold build (refused under PROXYKIT_REQUIRE_KERNEL=1).
#
# usage: hack/apiserver/tier.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)

skip() {
	if [ "${PROXYKIT_REQUIRE_KERNEL:-}" = 1 ]; then
		echo "apiserver: API server tier cannot run (PROXYKIT_REQUIRE_KERNEL=1): $*" >&2
		exit 1
	fi
	echo "apiserver: API server tier skipped: $*" >&2
	exit 0
}

[ "${PROXYKIT_SKIP_APISERVER:-}" = 1 ] && skip "PROXYKIT_SKIP_APISERVER=1"
[ "$(id -u)" = 0 ] || skip "not root (its tests run in network namespaces)"
dir=$("$here/build.sh") || skip "building kube-apiserver, etcd and kube-proxy failed"
echo "apiserver: kube-apiserver, etcd and kube-proxy in $dir" >&2
echo "$dir"
