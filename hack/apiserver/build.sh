#!/bin/sh
# Builds kube-apiserver, etcd and kube-proxy for the API server test tier
# (internal/testkit/apiservertest, the TestAPIServer* tests; kube-proxy for
# the drop-in tests that run it beside our proxier) and prints the
# directory that holds them.
#
# usage: hack/apiserver/build.sh [-n]
#
# All come from this directory's Go module, not the library's: kube-apiserver
# and kube-proxy from k8s.io/kubernetes at the release of the library's k8s.io
# line, with every staging module pinned by a replace to the matching v0.x
# version; etcd as etcd's own server command (etcd/main.go) at the version
# that release requires. The module proxy serves them like any other module.
# They are built by one `go build`, so the packages kube-proxy shares with
# kube-apiserver (client-go, apimachinery, component-base) compile once.
#
# The binaries are cached outside the repository, in
# $PROXYKIT_APISERVER_CACHE, else $XDG_CACHE_HOME/proxykit/apiserver, else
# ~/.cache/proxykit/apiserver, under a key made of this module's go.mod,
# go.sum and etcd/main.go and the Go version: a second run finds them and
# costs well under a second; a change of any of those builds anew (and
# removes the builds of other keys). A cold build takes many minutes of CPU
# (see the README); it runs under nice.
#
# -n only looks: it prints the directory if the binaries are there and
# otherwise exits 3 without building. The tests use it to find the
# binaries when PROXYKIT_APISERVER_BIN does not name them.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
check_only=
case "${1:-}" in
-n) check_only=1 ;;
"") ;;
*) echo "usage: $0 [-n]" >&2; exit 2 ;;
esac

command -v go >/dev/null 2>&1 || { echo "apiserver: no go command on PATH" >&2; exit 2; }
key=$({ cat "$here/go.mod" "$here/go.sum" "$here/etcd/main.go"; go version; } | sha256sum | cut -c1-16)
cache=${PROXYKIT_APISERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/proxykit/apiserver}
dir=$cache/$key

bins="kube-apiserver etcd kube-proxy"
built() {
	for b in $bins; do
		[ -x "$dir/$b" ] || return 1
	done
}

if built; then
	echo "$dir"
	exit 0
fi
if [ -n "$check_only" ]; then
	echo "apiserver: kube-apiserver, etcd and kube-proxy are not built for key $key (run hack/apiserver/build.sh)" >&2
	exit 3
fi

mkdir -p "$cache"
# One build at a time per cache: two `make test` runs on one machine (or a
# developer's beside CI's) would otherwise both spend the cold build and
# race to rename into $dir. The second waits here, then finds the first's
# binaries below. flock is util-linux's, on every Debian.
if command -v flock >/dev/null 2>&1; then
	exec 9>"$cache/.lock"
	if ! flock -n 9; then
		echo "apiserver: another build holds $cache/.lock; waiting for it" >&2
		flock 9
	fi
	if built; then
		echo "$dir"
		exit 0
	fi
fi
tmp=$(mktemp -d "$cache/.build-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "apiserver: building $bins into $dir (cold: many minutes)" >&2
(
	cd "$here"
	# The library's workspace or vendoring must not leak in.
	export GOWORK=off GOFLAGS="${GOFLAGS:-} -mod=readonly"
	# With -o naming a directory, each main package is written there
	# under its last path element. No -trimpath, and go.mod holds the
	# library's versions of the modules both build: then the packages the
	# library's own build compiles (client-go, the API types, prometheus,
	# the standard library: most of what it compiles) are the same
	# compilations in Go's build cache, done once on a cold machine.
	nice -n 10 go build -ldflags=-s -o "$tmp/" \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-proxy ./etcd
)
# Older keys are builds of a previous go.mod or Go: nothing uses them.
for old in "$cache"/*; do
	[ -d "$old" ] && [ "$old" != "$dir" ] && rm -rf "$old"
done
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "apiserver: built in $(($(date +%s) - start))s" >&2
echo "$dir"
