#!/bin/bash
# Run `kvmem bench recall` as many processes side by side on a machine with
# many cores: one per (size, depth, policy group). Processes of one size and
# depth build the same workspaces (same seeds), so their cells combine into
# one table; each writes its own CSV and log under OUTDIR.
#
#   tools/bench/recall_parallel.sh OUTDIR SIZES DEPTHS GROUPS [THREADS] [QUESTIONS]
#     SIZES    space-separated sizes, e.g. "1 4 16"
#     DEPTHS   space-separated depths, e.g. "0.1 0.5 0.9"
#     GROUPS   space-separated policy lists, e.g. "full,meank,subblock recency,oracle"
#     THREADS  OpenMP threads per process (default 2)
#     QUESTIONS per cell (default 200)
# KVMEM (default build/kvmem) and MODEL (default models/agentlang) may be set.
# Merge with: tools/bench/recall_merge.sh OUTDIR/*.csv > all.csv
set -u
[ $# -ge 4 ] || { sed -n 2,14p "$0" >&2; exit 2; }
out=$1 sizes=$2 depths=$3 groups=$4 threads=${5:-2} questions=${6:-200}
kvmem=${KVMEM:-build/kvmem} model=${MODEL:-models/agentlang}
mkdir -p "$out"
pids=()
for s in $sizes; do
	for d in $depths; do
		g=0
		for pol in $groups; do
			g=$((g + 1))
			name="$out/recall_s${s}_d${d}_g${g}"
			OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=passive "$kvmem" bench recall \
				--model "$model" --sizes "$s" --depths "$d" --policies "$pol" \
				--questions "$questions" --csv "$name.csv" >"$name.log" 2>&1 &
			pids+=($!)
		done
	done
done
echo "recall_parallel: ${#pids[@]} processes, $threads threads each, on $(nproc) cores" >&2
rc=0
for p in "${pids[@]}"; do
	wait "$p" || rc=1
done
exit $rc
