#!/bin/bash
# The cost of the BPF tools to the pager: `kvmem bench pager` with and
# without each tool attached, alternated (without, with, without, with, ...)
# in one run so drift hits both sides alike. For every tool and page size it
# prints the median over the pairs of (figure with the tool) / (figure
# without), for page-in and stage-out throughput, with the smallest and the
# largest pair ratio; 1.000 is no cost, 0.990 is 1% slower.
#
#   tools/bench/bpf_overhead.sh [-n PAIRS] [-d DIR] [-s SIZE] [-p PAGES] [-r ROUNDS] [BUILD]
#
# BUILD: the build folder (default build) with kvmem and bpf/. DIR: where the
# bench writes (default /var/tmp; /dev/shm takes the disk out, leaving the
# CPU cost alone, the worst case). Needs root. Tools: kvmemtop, kvmemlat,
# kvmemsnoop (all with -j, output to /dev/null) and, for comparison, the per-page modes
# kvmemtop -P and kvmemsnoop -a. Every run's figures go to a CSV whose
# name is printed.
set -u
pairs=5 dir=/var/tmp size=128M pages=64K,1M rounds=3
while getopts "n:d:s:p:r:" o; do
	case $o in
	n) pairs=$OPTARG ;;
	d) dir=$OPTARG ;;
	s) size=$OPTARG ;;
	p) pages=$OPTARG ;;
	r) rounds=$OPTARG ;;
	*) sed -n '2,17p' "$0"; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
build=${1:-build}
KV=$build/kvmem
[ -x "$KV" ] && [ -x "$build/bpf/kvmemtop" ] || { echo "no $KV or $build/bpf/kvmemtop (make bpf)"; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "the BPF tools need root"; exit 1; }
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
tmp=$(mktemp -d /tmp/kvmem-bpf-overhead.XXXXXX)
csv=$tmp/runs.csv
tool_pid=""
trap '[ -n "$tool_pid" ] && kill -INT $tool_pid 2>/dev/null; wait 2>/dev/null' EXIT
# A private copy: the tools attach to its file, nothing else is traced.
cp "$KV" "$tmp/kvmem"

# bench LABEL PAIR: one bench pager run; appends "label,pair,page,stage_out,page_in".
bench() {
	"$tmp/kvmem" bench pager --dir "$dir" --size "$size" --pages "$pages" --rounds "$rounds" \
		2>/dev/null | sed 's/ LOW//g' |
		awk -v l="$1" -v p="$2" '$2 == "KiB" && $1 ~ /^[0-9]+$/ { print l "," p "," $1 "," $4 "," $7 }' \
		>>"$csv"
}

start_tool() { # OUT TOOL ARGS...
	local out=$1 i
	shift
	"$@" >/dev/null 2>"$out" &
	tool_pid=$!
	for i in $(seq 100); do
		grep -q "^Tracing" "$out" 2>/dev/null && return 0
		sleep 0.1
	done
	echo "could not start $*: $(cat "$out")"
	exit 1
}

stop_tool() {
	kill -INT "$tool_pid"
	wait "$tool_pid"
	tool_pid=""
}

tools=("kvmemtop" "kvmemlat" "kvmemsnoop" "kvmemtop -P" "kvmemsnoop -a")
echo "bpf overhead: kvmem bench pager --dir $dir --size $size --pages $pages --rounds $rounds;" \
	"$pairs pairs per tool, alternated; $(date -u +%F), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for t in "${tools[@]}"; do
	read -r -a argv <<<"$t"
	for i in $(seq "$pairs"); do
		bench "none:$t" "$i"
		interval=3600	# top and lat print once, at the end
		[ "${argv[0]}" = kvmemsnoop ] && interval=""
		start_tool "$tmp/tool.err" "$build/bpf/${argv[0]}" "${argv[@]:1}" -j -b "$tmp/kvmem" $interval
		bench "$t" "$i"
		stop_tool
	done
done

# Pair ratios per tool, page size and figure; median, min, max.
printf "\n%-14s %8s   %-26s %-26s\n" "tool" "page" "page-in with/without" "stage-out with/without"
for t in "${tools[@]}"; do
	awk -F, -v t="$t" '
		$1 == "none:" t { base_out[$2 "," $3] = $4; base_in[$2 "," $3] = $5 }
		$1 == t { k = $2 "," $3; rin[$3] = rin[$3] " " $5 / base_in[k]; rout[$3] = rout[$3] " " $4 / base_out[k]
			  if (!($3 in seen)) { seen[$3] = 1; order[++n_sizes] = $3 } }
		function stats(list,   a, n, i, j, x) {
			n = split(list, a, " ")
			for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
			return sprintf("%.3f (%.3f-%.3f)", n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2, a[1], a[n])
		}
		END { for (i = 1; i <= n_sizes; i++) { s = order[i]
			printf "%-14s %4s KiB   %-26s %-26s\n", t, s, stats(rin[s]), stats(rout[s]) } }
	' "$csv"
done
echo "runs: $csv"
