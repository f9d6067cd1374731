#!/bin/bash
# On the GPU machine (issue #26): a lone stream sampling at a temperature
# waits for its draw between two forwards. kvmem_sample's passes now run on
# OpenMP's threads when a draw is alone (KVMEM_SAMPLE_THREADS=1: on one, as
# before). tools/bench/sample_cost.c both ways, then kvmem bench serve with
# one client at the 8B geometry (fp8 views, 128-token answers): greedy (the
# peer: no draw on the host), sampled at T 0.8, sampled with the draw on one
# thread, in the same call.
#
#   tests/gpu/draw26.sh OUTDIR [SECONDS]   (logs in OUTDIR/draw26)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/draw26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_begin draw26 240 "${2:-}"
for t in "" 1; do
	echo "== KVMEM_SAMPLE_THREADS=$t sample_cost 20"
	KVMEM_SAMPLE_THREADS=$t timeout "$(gpu_left 60)" "$B/tools/sample_cost" 20 | tail -4
done
args=(--preset 8b --backend cuda --kv-dtype fp8 --clients 1 --mode closed --requests 3
	--tokens 128 --lines 8)
for run in greedy sampled sampled1; do
	extra=()
	[ $run = greedy ] || extra=(--temperature 0.8)
	echo "== $run: kvmem bench serve ${args[*]} ${extra[*]}"
	( [ $run = sampled1 ] && export KVMEM_SAMPLE_THREADS=1
	  timeout "$(gpu_left 80)" "$K" bench serve "${args[@]}" "${extra[@]}" >"$log/$run.txt" 2>&1 ) &&
		ok "bench serve $run" || bad "bench serve $run"
	grep -E "^closed|^load" "$log/$run.txt"
done
gpu_done
