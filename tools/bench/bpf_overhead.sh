#!/bin/bash
# The cost of the BPF tools to the pager, two ways, in one run:
#
# 1. Measured: `kvmem bench pager` with and without each tool attached,
#    alternated (without, with, without, with, ...) so drift hits both
#    sides alike. Per tool and page size: the median over the pairs of
#    (figure with the tool) / (figure without), page-in and stage-out
#    throughput, with the smallest and largest pair ratio (1.000: no cost,
#    0.990: 1% slower). On a shared machine the spread can be far larger
#    than the effect; then the second way is the figure to read.
# 2. Modelled: the CPU time one probe hit costs with the tool's program on
#    it (tools/bench/usdt_cost.c: the thread's CPU time, trap and program
#    included, other processes mostly not), times the tool's probe hits in
#    a bench run per page size (BPF run counts, kernel.bpf_stats_enabled
#    for the run), as a share of the time the run's pages take to move
#    (stage-out and page-in) at the bench's median throughput without it;
#    and the page-in phase alone: the hits of every program but those on
#    stage_out, commit, step and backpressure (an upper bound where a
#    program fires in both phases) over the pages read and their time.
#
#   tools/bench/bpf_overhead.sh [-n PAIRS] [-d DIR] [-s SIZE] [-p PAGES] [-r ROUNDS] [-M] [BUILD]
#
# BUILD: the build folder (default build) with kvmem and bpf/. DIR: where the
# bench writes (default /var/tmp; /dev/shm takes the disk out, leaving the
# CPU cost alone, the worst case). -M: the model only (pairs are still run
# for the throughput, one pair per tool). Needs root. Tools: kvmemtop,
# kvmemlat, kvmemlat -x page_in, kvmemsnoop (all with -j, output to
# /dev/null) and, for comparison, the per-page modes kvmemtop -P and
# kvmemsnoop -a. Every run's
# figures go to a CSV whose name is printed.
set -u
pairs=5 dir=/var/tmp size=128M pages=64K,1M rounds=3 model_only=0
while getopts "n:d:s:p:r:M" o; do
	case $o in
	M) model_only=1; pairs=1 ;;
	n) pairs=$OPTARG ;;
	d) dir=$OPTARG ;;
	s) size=$OPTARG ;;
	p) pages=$OPTARG ;;
	r) rounds=$OPTARG ;;
	*) sed -n '2,/^set -u$/{/^set -u$/!p}' "$0"; exit 2 ;;
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
stats0=$(sysctl -n kernel.bpf_stats_enabled 2>/dev/null || echo 0)
trap '[ -n "$tool_pid" ] && kill -INT $tool_pid 2>/dev/null; wait 2>/dev/null;
      sysctl -qw kernel.bpf_stats_enabled=$stats0 2>/dev/null' EXIT
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
	rm -f "$out"	# a stale "Tracing" line must not count as this start
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

# prog_ids: the ids of the BPF programs loaded now.
prog_ids() { bpftool prog show 2>/dev/null | awk -F: '/^[0-9]+:/ { print $1 }' | sort; }
# run_cnt [-i] IDS...: their probe hits so far (kernel.bpf_stats_enabled);
# -i: only programs that fire in the page-in phase (not on the stage-out
# phase's stage_out, commit, step, backpressure probes).
run_cnt() {
	local id n=0 c in=0
	[ "$1" = -i ] && { in=1; shift; }
	for id in "$@"; do
		c=$(bpftool prog show id "$id" 2>/dev/null | awk -v in_only=$in '
			{ for (i = 1; i < NF; i++) { if ($i == "name") nm = $(i + 1); if ($i == "run_cnt") c = $(i + 1) } }
			END { print (in_only && nm ~ /^usdt_(stage_out|commit|step|backpress)/) ? 0 : c + 0 }')
		n=$((n + ${c:-0}))
	done
	echo $n
}

# tool_args BINARY TOOL...: the arguments a tool runs with here.
tool_args() {
	interval=3600	# top and lat print once, at the end
	[ "$2" = kvmemsnoop ] && interval=""
	echo "$build/bpf/$2" "${@:3}" -j -b "$1" $interval
}

tools=("kvmemtop" "kvmemlat" "kvmemlat -x page_in" "kvmemsnoop" "kvmemtop -P" "kvmemsnoop -a")
echo "bpf overhead: kvmem bench pager --dir $dir --size $size --pages $pages --rounds $rounds;" \
	"$pairs pairs per tool, alternated; $(date -u +%F), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for t in "${tools[@]}"; do
	read -r -a argv <<<"$t"
	for i in $(seq "$pairs"); do
		bench "none:$t" "$i"
		# shellcheck disable=SC2046
		start_tool "$tmp/tool.err" $(tool_args "$tmp/kvmem" "${argv[@]}")
		bench "$t" "$i"
		stop_tool
	done
done

if [ $model_only -eq 0 ]; then
# Pair ratios per tool, page size and figure; median, min, max.
printf "\n%-19s %8s   %-26s %-26s\n" "tool" "page" "page-in with/without" "stage-out with/without"
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
			printf "%-19s %4s KiB   %-26s %-26s\n", t, s, stats(rin[s]), stats(rout[s]) } }
	' "$csv"
done
fi

# ---- the model -------------------------------------------------------------------
gcc -std=c11 -D_GNU_SOURCE -O2 -Iuser -o "$tmp/usdt_cost" tools/bench/usdt_cost.c ||
	{ echo "cannot build tools/bench/usdt_cost.c"; exit 1; }
median() { sort -n | awk '{ a[NR] = $1 } END { print NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
# cost PROBE: median CPU ns per hit over 5 runs of 200000 hits
cost() { for i in 1 2 3 4 5; do "$tmp/usdt_cost" "$1" 200000; done | median; }
declare -A probe=([kvmemtop]=page_in_batch [kvmemlat]=page_in_batch [kvmemsnoop]=evict
		  ["kvmemlat -x page_in"]=fetch ["kvmemtop -P"]=hit ["kvmemsnoop -a"]=hit)
base_in=$(cost page_in) base_batch=$(cost page_in_batch) base_fetch=$(cost fetch)
base_hit=$(cost hit) base_evict=$(cost evict)
sysctl -qw kernel.bpf_stats_enabled=1 || { echo "cannot enable kernel.bpf_stats_enabled"; exit 1; }
printf "\n%-19s %-13s %7s  %s\n" "tool" "probe" "ns/hit" \
	"per page size: probe hits per page moved; their CPU time as a share of the paging time; the same for the page-in phase"
IFS=, read -r -a sizes <<<"$pages"
for t in "${tools[@]}"; do
	read -r -a argv <<<"$t"
	p=${probe[$t]}
	# the probe's cost with the tool's program on it, less the bare loop's
	# shellcheck disable=SC2046
	start_tool "$tmp/tool.err" $(tool_args "$tmp/usdt_cost" "${argv[@]}")
	bare=$base_in
	[ "$p" = hit ] && bare=$base_hit
	[ "$p" = evict ] && bare=$base_evict
	[ "$p" = page_in_batch ] && bare=$base_batch
	[ "$p" = fetch ] && bare=$base_fetch
	ns=$(awk -v a="$(cost "$p")" -v b="$bare" 'BEGIN { printf "%.0f", a - b }')
	stop_tool
	# its probe hits on a bench run per page size
	before=$(prog_ids)
	# shellcheck disable=SC2046
	start_tool "$tmp/tool.err" $(tool_args "$tmp/kvmem" "${argv[@]}")
	mapfile -t ids < <(comm -13 <(echo "$before") <(prog_ids))
	line=""
	for sz in "${sizes[@]}"; do
		h0=$(run_cnt "${ids[@]}") i0=$(run_cnt -i "${ids[@]}")
		"$tmp/kvmem" bench pager --dir "$dir" --size "$size" --pages "$sz" --rounds 1 \
			>"$tmp/bench.out" 2>&1 || { echo "bench pager failed: $(tail -2 "$tmp/bench.out")"; exit 1; }
		h=$(($(run_cnt "${ids[@]}") - h0)) hi=$(($(run_cnt -i "${ids[@]}") - i0))
		kib=${sz%K}
		[ "$kib" != "$sz" ] || kib=$((${sz%M} * 1024))
		# pages moved: the stage-out and the page-in of the run
		moved=$(awk -v s="$size" -v k="$kib" 'BEGIN { m = s + 0; u = substr(s, length(s));
			if (u == "G") m *= 1048576; else if (u == "M") m *= 1024; print 2 * m / k }')
		line="$line$(awk -F, -v h="$h" -v hi="$hi" -v n="$moved" -v ns="$ns" -v k="$kib" -v sz="$kib" '
			$1 ~ /^none:/ && $3 == sz { pin[++a] = $5; pout[++b] = $4 }
			function med(x, n,   i, j, v) { for (i = 2; i <= n; i++) { v = x[i];
				for (j = i - 1; j >= 1 && x[j] > v; j--) x[j + 1] = x[j]; x[j + 1] = v }
				return n % 2 ? x[(n + 1) / 2] : (x[n / 2] + x[n / 2 + 1]) / 2 }
			END { tin = k * 1024 / (med(pin, a) * 1e6) * 1e9; tout = k * 1024 / (med(pout, b) * 1e6) * 1e9
				printf "  %5s KiB: %.2f hits/page, %.2f%%; page-in %.2f, %.2f%%", k, h / n,
					100 * h * ns / (n / 2 * (tin + tout)), hi / (n / 2), 100 * hi * ns / (n / 2 * tin) }' "$csv")"
	done
	stop_tool
	printf "%-19s %-13s %7s %s\n" "$t" "$p" "$ns" "$line"
done
echo "runs: $csv"
