#!/bin/sh
# The regression check BENCHMARKS.md asks for before a change to a hot path
# lands: for each hot-path package the change touches, the package's quoted
# benchmarks at BASE and in the working tree, on this machine in one run,
# compared by benchstat.
#
# Both test binaries are built first (BASE in a throwaway worktree), then run
# COUNT times each, alternating, so that whatever else the machine does falls
# on both sides alike. The check fails when a benchmark is significantly
# worse (benchstat's test, p <= 0.05) by more than THRESHOLD percent in
# time or allocated bytes, or allocates more often at all; a benchmark that
# BASE lacks is reported as new. Kernel benchmarks are not run here: they
# need root and minutes each (BENCHMARKS.md gives their commands).
#
# usage: hack/benchcheck.sh [-a] [-n COUNT] [-t THRESHOLD] [BASE]
#   -a            every hot-path package, not only those the change touches
#   -n COUNT      runs per side (default 6)
#   -t THRESHOLD  percent of time or bytes tolerated (default 10)
#   BASE          the commit to compare with (default: the merge base of
#                 HEAD and main)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
GO=${GO:-go}
BENCHSTAT=${BENCHSTAT:-golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da}

all= count=6 threshold=10
while getopts an:t: opt; do
	case $opt in
	a) all=1 ;;
	n) count=$OPTARG ;;
	t) threshold=$OPTARG ;;
	*) sed -n 's/^# \{0,1\}//p' "$0" | sed -n '/^usage/,$p' >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
cd "$root"
base=${1:-$(git merge-base HEAD main)}
base=$(git rev-parse --verify "$base^{commit}")

# The hot paths and the benchmarks BENCHMARKS.md quotes for them, one
# package per line: directory, then the -test.bench pattern.
hot='changetracker InitialLoad/10000x10|SingleSliceChange/10000x10
iptables SyncFirst/10000x10|SyncFull/10000x10|SyncPartial/10000x10
nftables SyncFull/10000x10|SyncPartial/10000x10
proxier Pipeline/10000x10
ipset IPSetReconcile
ipvs IPVSReconcile
conntrack CleanStaleEntries'

changed=$( { git diff --name-only "$base" HEAD; git diff --name-only HEAD; } | sort -u)
work=$(mktemp -d)
tree=$work/base
cleanup() {
	git worktree remove --force "$tree" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT INT TERM
git worktree add --detach "$tree" "$base" >/dev/null 2>&1

status=0
while read -r pkg pattern; do
	[ -n "$pkg" ] || continue
	if [ -z "$all" ] && ! echo "$changed" | grep -q "^$pkg/[^/]*\.go$"; then
		continue
	fi
	echo "--- $pkg: $pattern (base $(git rev-parse --short "$base"), $count runs a side)"
	if ! (cd "$tree" && $GO test -c -o "$work/$pkg.base.test" "./$pkg"); then
		echo "benchcheck: $pkg does not build at the base" >&2
		status=1
		continue
	fi
	$GO test -c -o "$work/$pkg.head.test" "./$pkg"
	: >"$work/$pkg.base.txt"
	: >"$work/$pkg.head.txt"
	i=0
	while [ "$i" -lt "$count" ]; do
		for side in base head; do
			dir=$root
			[ "$side" = base ] && dir=$tree
			(cd "$dir/$pkg" && "$work/$pkg.$side.test" -test.run '^$' -test.bench "$pattern" -test.benchmem -test.count 1) >>"$work/$pkg.$side.txt"
		done
		i=$((i + 1))
	done
	$GO run "$BENCHSTAT" base="$work/$pkg.base.txt" head="$work/$pkg.head.txt"
	$GO run "$BENCHSTAT" -format csv base="$work/$pkg.base.txt" head="$work/$pkg.head.txt" 2>/dev/null >"$work/$pkg.csv"
	# benchstat's CSV: one block per unit, a header naming the unit, then a
	# row per benchmark whose "vs base" column is "~" (no significant
	# change) or a signed percentage.
	if ! awk -F, -v t="$threshold" -v pkg="$pkg" '
		$2 ~ /sec\/op|B\/op|allocs\/op/ { unit = $2; next }
		$1 == "" || $1 == "geomean" { next }
		{
			d = $(NF - 1)
			if (d !~ /^\+[0-9.]+%$/) next
			sub(/^\+/, "", d); sub(/%$/, "", d)
			if (unit ~ /allocs\/op/ || d + 0 > t + 0) {
				printf "benchcheck: %s %s is worse by %s%% in %s\n", pkg, $1, d, unit
				bad = 1
			}
		}
		END { exit bad }' "$work/$pkg.csv"; then
		status=1
	fi
done <<EOF
$hot
EOF
exit $status
