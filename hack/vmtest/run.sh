#!/bin/sh
# Run Go test packages inside a small VM with a stock Debian cloud kernel,
# for the kernel features the host's own kernel lacks (IPVS, dummy links).
#
# usage: hack/vmtest/run.sh [-v] [-run REGEX] [-bench REGEX] [-benchmem] [-benchtime T] [-count N] [-timeout D] PKG[:REGEX]...
#    eg: hack/vmtest/run.sh ./ipvs
#        hack/vmtest/run.sh -v -run 'TestVMScale' ./ipvs
#        hack/vmtest/run.sh ./ipvs ./examples/proxier:^TestVM
#
# PKG:REGEX runs only the tests of PKG that match REGEX (as -run does; a
# -run flag applies to the packages without one): for a package whose other
# tests need what only the host has, and run in the host's tiers.
#
# Each package is built into a test binary (go test -c, with the default cgo
# setting: a static CGO_ENABLED=0 build would compile every package that
# imports net a second time, where this one shares the compilations of go vet
# and the API server tier's build in Go's cache), with the shared libraries
# it loads. A package that is a command (package main) is also built into a
# binary beside it, whose path its tests find in PROXYKIT_TEST_COMMAND:
# there is no Go toolchain in the VM to build it there. The binaries are
# put, with busybox, the IPVS, conntrack, ipset, veth, bridge, dummy and sctp modules,
# the netfilter modules of IPVS mode's iptables rules, the host's
# iptables-legacy binaries (with their shared libraries, dynamic loader and
# extensions) and hack/vmtest/init.sh as /init, into an initramfs. QEMU boots it with
# software emulation (-accel tcg -cpu max: /dev/kvm on the CI machines cannot
# boot a stock kernel); init loads the modules, runs each binary with
# PROXYKIT_VM=1 and PROXYKIT_REQUIRE_KERNEL=1, prints the exit status and
# powers off. The script exits with that status: 0 only if every package
# passed.
#
# Missing tools (qemu-system-x86, busybox-static, cpio, kmod, iptables) are installed
# with apt-get when running as root. The kernel package is fetched with
# `apt-get download` and unpacked once into the cache directory:
# $PROXYKIT_VM_CACHE, else $XDG_CACHE_HOME/proxykit-vm, else
# /var/cache/proxykit-vm as root and ~/.cache/proxykit-vm otherwise; none of
# them is inside the repository. PROXYKIT_VM_KERNEL_PKG names another kernel
# package (default: what linux-image-cloud-amd64 depends on);
# PROXYKIT_VM_TIMEOUT bounds the VM's run in seconds (default 900; each test
# binary gets -test.timeout 10m unless -timeout says otherwise);
# PROXYKIT_VM_MEM is its memory (default 1024M); PROXYKIT_VM_CPU the CPU
# model QEMU emulates (default max).
set -eu

die() { echo "vmtest: $*" >&2; exit 2; }
log() { echo "vmtest: $*" >&2; }

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

testargs=""
pkgs=""
while [ $# -gt 0 ]; do
	case "$1" in
	-v) testargs="$testargs -test.v" ;;
	-run|-bench|-benchtime|-count|-timeout)
		[ $# -ge 2 ] || die "$1 needs a value"
		case "$2" in *[[:space:]]*) die "$1 $2: values with spaces are not supported" ;; esac
		testargs="$testargs -test.${1#-} $2"
		shift ;;
	-benchmem) testargs="$testargs -test.benchmem" ;;
	-*) die "unknown flag $1" ;;
	*) pkgs="$pkgs $1" ;;
	esac
	shift
done
[ -n "$pkgs" ] || die "usage: $0 [-v] [-run REGEX] [-bench REGEX] [-benchmem] [-benchtime T] [-count N] [-timeout D] PKG[:REGEX]..."
case "$testargs" in *-test.timeout*) ;; *) testargs="-test.timeout 10m$testargs" ;; esac

# Tools.
need=""
command -v qemu-system-x86_64 >/dev/null || need="$need qemu-system-x86"
command -v cpio >/dev/null || need="$need cpio"
command -v depmod >/dev/null || need="$need kmod"
busybox=""
for b in /bin/busybox /usr/bin/busybox; do
	# Only a static busybox runs in an initramfs without a libc.
	if [ -x "$b" ] && ! ldd "$b" >/dev/null 2>&1; then busybox=$b; break; fi
done
[ -n "$busybox" ] || need="$need busybox-static"
xtables=""
for x in /usr/sbin/xtables-legacy-multi /sbin/xtables-legacy-multi; do
	if [ -x "$x" ]; then xtables=$x; break; fi
done
[ -n "$xtables" ] || need="$need iptables"
if [ -n "$need" ]; then
	[ "$(id -u)" = 0 ] || die "missing packages:$need (install them, or run as root to have them installed)"
	log "installing$need"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null
	busybox=/bin/busybox
	xtables=/usr/sbin/xtables-legacy-multi
fi
command -v go >/dev/null || die "go not found on PATH"

# The kernel, unpacked once into the cache.
if [ -n "${PROXYKIT_VM_CACHE:-}" ]; then cache=$PROXYKIT_VM_CACHE
elif [ -n "${XDG_CACHE_HOME:-}" ]; then cache=$XDG_CACHE_HOME/proxykit-vm
elif [ "$(id -u)" = 0 ]; then cache=/var/cache/proxykit-vm
else cache=$HOME/.cache/proxykit-vm
fi
mkdir -p "$cache"

kpkg=${PROXYKIT_VM_KERNEL_PKG:-}
if [ -z "$kpkg" ]; then
	kpkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')
	if [ -z "$kpkg" ] && [ "$(id -u)" = 0 ]; then
		apt-get update -qq
		kpkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')
	fi
	if [ -z "$kpkg" ]; then
		# Offline: fall back to a kernel unpacked by an earlier run.
		kpkg=$(ls -1 "$cache" 2>/dev/null | grep '^linux-image-.*-cloud-amd64$' | sort -V | tail -n 1 || true)
	fi
	[ -n "$kpkg" ] || die "cannot find a linux-image-*-cloud-amd64 package (is a Debian archive in the apt sources?)"
fi
kroot=$cache/$kpkg
if [ ! -f "$kroot/.unpacked" ]; then
	log "fetching $kpkg"
	rm -rf "$kroot" "$cache/download"
	mkdir -p "$cache/download"
	(cd "$cache/download" && apt-get -o APT::Sandbox::User=root download "$kpkg" >/dev/null) || die "apt-get download $kpkg failed"
	dpkg -x "$cache/download/"*.deb "$kroot"
	rm -rf "$cache/download"
	touch "$kroot/.unpacked"
fi
kver=$(ls -1 "$kroot/lib/modules" | head -n 1)
vmlinuz=$kroot/boot/vmlinuz-$kver
[ -f "$vmlinuz" ] || die "$kpkg has no /boot/vmlinuz-$kver"
# The package ships no modules.dep; make it once.
[ -f "$kroot/lib/modules/$kver/modules.dep" ] || depmod -b "$kroot" "$kver"

# The initramfs.
work=$(mktemp -d "${TMPDIR:-/tmp}/proxykit-vm.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
root=$work/root
mkdir -p "$root/bin" "$root/tests" "$root/lib/modules/$kver"
cp "$busybox" "$root/bin/busybox"
cp "$here/init.sh" "$root/init"
chmod 755 "$root/init"

# xfrm_user: vishvananda/netlink handles made without a family list open an
# XFRM socket too, and fail without it. nf_conntrack_netlink: a proxier's
# conntrack cleanup; bridge: the pods' network of its end-to-end tests;
# sctp: the socket load balancer's SCTP test (the machines of the other
# tiers have no SCTP). The
# rest are the legacy x_tables and the matches and targets of the proxy
# modes' rules, loaded up front because the kernel's on-demand loading needs
# a modprobe where the kernel looks for one.
modules="ip_vs ip_vs_rr ip_vs_wrr ip_vs_sh ip_vs_lc nf_conntrack nf_conntrack_netlink veth dummy bridge xfrm_user sctp
ip_set ip_set_hash_ip ip_set_hash_ipport ip_set_hash_ipportip ip_set_hash_ipportnet
ip_set_hash_net ip_set_hash_netport ip_set_bitmap_port xt_set
ip_tables iptable_nat iptable_filter iptable_mangle ip6_tables ip6table_nat ip6table_filter ip6table_mangle nf_nat
xt_comment xt_mark xt_MASQUERADE xt_addrtype xt_conntrack xt_tcpudp xt_multiport
xt_statistic xt_recent xt_nat ipt_REJECT ip6t_REJECT"
for m in $modules; do
	modprobe -d "$kroot" -S "$kver" --show-depends "$m" 2>/dev/null | while read -r kind path _; do
		[ "$kind" = insmod ] || continue
		rel=${path#"$kroot"/}
		mkdir -p "$root/$(dirname "$rel")"
		case "$rel" in
		*.ko.xz) xz -dc "$path" >"$root/${rel%.xz}" ;;
		*.ko.zst) zstd -qdc "$path" >"$root/${rel%.zst}" ;;
		*.ko.gz) gzip -dc "$path" >"$root/${rel%.gz}" ;;
		*) cp "$path" "$root/$rel" ;;
		esac
	done
done
for f in modules.builtin modules.builtin.modinfo modules.order; do
	[ -f "$kroot/lib/modules/$kver/$f" ] && cp "$kroot/lib/modules/$kver/$f" "$root/lib/modules/$kver/"
done
depmod -b "$root" "$kver"
echo "$modules" >"$root/modules"

# iptables-legacy from the host, which the initramfs's busybox lacks: the
# multi-call binary with its names, and every shared library that it and
# its extensions (dlopened from the directory it was built with) load,
# at the paths ldd resolves, the dynamic loader included.
withlibs() {
	for f in "$@"; do
		ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'
	done | sort -u | while read -r lib; do
		mkdir -p "$root$(dirname "$lib")"
		cp -L "$lib" "$root$lib"
	done
}
mkdir -p "$root/usr/sbin"
cp -L "$xtables" "$root/usr/sbin/xtables-legacy-multi"
for name in iptables-legacy iptables-legacy-save iptables-legacy-restore ip6tables-legacy ip6tables-legacy-save ip6tables-legacy-restore; do
	ln -s xtables-legacy-multi "$root/usr/sbin/$name"
done
xtlib=""
for d in /usr/lib/x86_64-linux-gnu/xtables /usr/lib64/xtables /usr/lib/xtables; do
	if [ -d "$d" ]; then xtlib=$d; break; fi
done
[ -n "$xtlib" ] || die "no xtables extension directory for $xtables"
mkdir -p "$root$xtlib"
cp -L "$xtlib"/*.so "$root$xtlib/"
withlibs "$xtables" "$xtlib"/*.so
n=0
for spec in $pkgs; do
	n=$((n + 1))
	p=${spec%%:*}
	args=$testargs
	if [ "$p" != "$spec" ]; then
		run=${spec#*:}
		case "$run" in *[[:space:]]*) die "$spec: values with spaces are not supported" ;; esac
		# Later flags win: this -run overrides a global one.
		args="$args -test.run $run"
	fi
	name=$(printf '%02d-%s' "$n" "$(echo "$p" | sed 's#^\./##; s#[/.]#_#g')")
	log "building $p"
	# Each binary runs in a directory of its own with the package's
	# testdata, as go test runs it in the package's directory, and reads
	# its flags from args there.
	dir=$root/tests/$name
	mkdir -p "$dir"
	(cd "$repo" && go test -c -o "$dir/$name.test" "$p") || die "building $p failed"
	[ -f "$dir/$name.test" ] || log "$p has no tests"
	[ ! -f "$dir/$name.test" ] || withlibs "$dir/$name.test"
	echo "$args" >"$dir/args"
	src=$(cd "$repo" && go list -f '{{.Dir}}' "$p") || die "go list $p failed"
	[ ! -d "$src/testdata" ] || cp -R "$src/testdata" "$dir/"
	if [ "$(cd "$repo" && go list -f '{{.Name}}' "$p")" = main ]; then
		(cd "$repo" && go build -o "$dir/command" "$p") || die "building the command $p failed"
		withlibs "$dir/command"
	fi
done

(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/initramfs.gz"

log "booting $kpkg ($kver) with $testargs"
out=$work/console.log
# mitigations=off and a trusted TSC clock only make the emulated guest
# faster: it runs nothing but the tests.
set +e
timeout "${PROXYKIT_VM_TIMEOUT:-900}" qemu-system-x86_64 \
	-accel tcg -cpu "${PROXYKIT_VM_CPU:-max}" -smp 1 -m "${PROXYKIT_VM_MEM:-1024M}" \
	-nographic -no-reboot -nodefaults -serial stdio \
	-kernel "$vmlinuz" -initrd "$work/initramfs.gz" \
	-append "console=ttyS0 panic=-1 quiet loglevel=3 mitigations=off clocksource=tsc tsc=reliable" </dev/null | tee "$out"
qemu=$?
set -e
status=$(sed -n 's/^PROXYKIT_VM_EXIT=\([0-9]*\).*/\1/p' "$out" | tail -n 1)
if [ -z "$status" ]; then
	log "the VM did not report an exit status (qemu exited with $qemu)"
	exit 1
fi
log "tests exited with $status"
exit "$status"
