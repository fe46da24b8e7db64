#!/bin/busybox sh
# /init of the VM that hack/vmtest/run.sh boots: load the kernel modules the
# tests need, run every test binary in /tests/*/ (from its own directory,
# which holds its package's testdata) with the flags in the args file
# there, and with PROXYKIT_TEST_COMMAND naming the package's command when
# run.sh built one, print the combined exit status as PROXYKIT_VM_EXIT=N
# (run.sh looks for that line) and power off.
/bin/busybox --install -s /bin
# /usr/sbin holds iptables-legacy, from the host.
export PATH=/bin:/usr/sbin
mkdir -p /proc /sys /dev /tmp /run
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mkdir -p /run/netns
ip link set lo up

for m in $(cat /modules); do
	modprobe "$m" || echo "vmtest: modprobe $m failed"
done
# Where the kernel runs modprobe to load a module on demand (an iptables
# match or target that /modules forgot).
echo /bin/modprobe >/proc/sys/kernel/modprobe
iptables-legacy --version >/dev/null 2>&1 || echo "vmtest: iptables-legacy does not run"

status=0
for t in /tests/*/*.test; do
	[ -x "$t" ] || continue
	name=${t##*/}
	echo "vmtest: running $name"
	dir=${t%/*}
	cd "$dir"
	command=""
	[ ! -x "$dir/command" ] || command=$dir/command
	# Word splitting of the flags is intended.
	# shellcheck disable=SC2046
	PROXYKIT_VM=1 PROXYKIT_REQUIRE_KERNEL=1 PROXYKIT_TEST_COMMAND=$command HOME=/tmp TMPDIR=/tmp "$t" $(cat "$dir/args")
	rc=$?
	echo "vmtest: $name exited with $rc"
	[ "$rc" = 0 ] || status=$rc
done

echo "PROXYKIT_VM_EXIT=$status"
sync
poweroff -f
