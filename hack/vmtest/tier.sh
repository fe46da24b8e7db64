#!/bin/sh
# The VM test tier as `make test` runs it: the named packages' tests in the
# VM of hack/vmtest/run.sh, when this machine can boot one.
#
# usage: hack/vmtest/tier.sh [run.sh flags] PKG...
#
# The VM needs qemu-system-x86_64 (run.sh installs it, with the rest, when
# running as root with apt-get) and a Debian cloud kernel package from the apt
# sources. Where neither is possible the tier is skipped with a message, and
# fails instead under PROXYKIT_REQUIRE_KERNEL=1, as the kernel tests do; CI
# sets it. PROXYKIT_SKIP_VM=1 skips the tier on purpose (and is refused under
# PROXYKIT_REQUIRE_KERNEL=1).
set -eu
here=$(cd "$(dirname "$0")" && pwd)

skip() {
	if [ "${PROXYKIT_REQUIRE_KERNEL:-}" = 1 ]; then
		echo "vmtest: VM tier cannot run (PROXYKIT_REQUIRE_KERNEL=1): $*" >&2
		exit 1
	fi
	echo "vmtest: VM tier skipped: $*" >&2
	exit 0
}

[ "${PROXYKIT_SKIP_VM:-}" = 1 ] && skip "PROXYKIT_SKIP_VM=1"
[ "$(uname -m)" = x86_64 ] || skip "the VM kernel is amd64 and this machine is $(uname -m)"
if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
	if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
		skip "qemu-system-x86_64 is not installed (run as root on Debian/Ubuntu to have it installed)"
	fi
fi
echo "--- VM tier: $*"
exec "$here/run.sh" "$@"
