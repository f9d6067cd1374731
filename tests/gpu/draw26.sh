#!/bin/bash
# On the GPU machine (issue #26): a lone stream sampling at a temperature
# waits for its draw between two forwards. tools/bench/sample_cost.c, then
# kvmem bench serve with one client at the 8B geometry (fp8 views, 128-token
# answers): greedy (the peer: no draw on the host) and sampled at T 0.8, in
# the same call. (A draw's passes spread over OpenMP's threads were
# measured with it on 2026-12-06 and taken out: benchmarks.md.)
#
#   tests/gpu/draw26.sh OUTDIR [SECONDS]   (logs in OUTDIR/draw26)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/draw26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_begin draw26 240 "${2:-}"
echo "== sample_cost 20"
timeout "$(gpu_left 60)" "$B/tools/sample_cost" 20 | tail -4
args=(--preset 8b --backend cuda --kv-dtype fp8 --clients 1 --mode closed --requests 3
	--tokens 128 --lines 8)
for run in greedy sampled; do
	extra=()
	[ $run = greedy ] || extra=(--temperature 0.8)
	echo "== $run: kvmem bench serve ${args[*]} ${extra[*]}"
	timeout "$(gpu_left 80)" "$K" bench serve "${args[@]}" "${extra[@]}" >"$log/$run.txt" 2>&1 &&
		ok "bench serve $run" || bad "bench serve $run"
	grep -E "^closed|^load" "$log/$run.txt"
done
gpu_done
