#!/bin/bash
# On the GPU machine (issue #26): the first token under Poisson arrivals
# against an unloaded server, at the 8B geometry. kvmem bench serve runs
# kvmem serve in its process with --preset 8b (random weights made on the
# GPU, text through the bytes tokenizer: tests/cli/test_serve_preset.sh
# checks that path on the CPU), closed loop then Poisson arrivals at 1 and
# 16 clients; each row's first-token p99 is put against the first load's
# (one client, closed: unloaded, after a warm-up request) and beside an
# ideal server's at the same arrivals. LINES workspace lines a prompt (300:
# about 8K tokens as bytes; 1200: about 32K), REQ requests a client.
# PREFILL lists the server's prefill settings to run, CHUNK:BUDGET each
# (default "512:2048 default 2048:8192": the server's GPU shape of the
# twelfth session, then kvmem serve's own (1024-token chunks, four a
# round), then larger). STEP_S: seconds a setting may take (140),
# GPU_MEM: the server's --gpu-mem, LOAD: the Poisson rows' --load (0.8 of
# the closed loop's rate; LOADS: several, a run each), ORDERS: the server's
# --prefill-order values to run, a run each (default: its own, fcfs).
# Figures: benchmarks.md ("The server's prefill
# sized for the backend", "The first token under load, against an ideal
# server").
#
#   tests/gpu/ttft26.sh OUTDIR [SECONDS]    (default 150; logs in OUTDIR/ttft26)
#
# Needs build-gpu's CLI (tools/gpu/bundle.sh; only build-gpu/kvmem and
# build-gpu/lib are read).
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/ttft26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_end=$(($(date +%s) + ${2:-150}))
B=build-gpu
[ -f "$B/bundle.tar.xz" ] && tar xJf "$B/bundle.tar.xz"
K=$B/kvmem
log=$OUT/ttft26
mkdir -p "$log"
export LD_LIBRARY_PATH=$PWD/$B/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMP_WAIT_POLICY=passive
t0=$(date +%s)
gpu_need "$K"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for pf in ${PREFILL:-512:2048 default 2048:8192}; do
for load in ${LOADS:-${LOAD:-default}}; do
for order in ${ORDERS:-default}; do
	args=(--preset 8b --backend cuda --clients 1,16 --mode both --requests "${REQ:-2}"
		--tokens 16 --lines "${LINES:-300}")
	[ "$pf" = default ] || args+=(--chunk "${pf%:*}" --prefill-budget "${pf#*:}")
	[ -z "${GPU_MEM:-}" ] || args+=(--gpu-mem "$GPU_MEM")
	[ "$load" = default ] || args+=(--load "$load")
	[ "$order" = default ] || args+=(--prefill-order "$order")
	name=${pf/:/x}	# no ':' in a name the run tool brings back
	[ "$load" = default ] || name=${name}_load$load
	[ "$order" = default ] || name=${name}_$order
	echo "== KVMEM_CUDA_GEMM_TC=1 kvmem bench serve ${args[*]}"
	if KVMEM_CUDA_GEMM_TC=1 timeout "$(gpu_left "${STEP_S:-140}")" "$K" bench serve "${args[@]}" \
		>"$log/bench_serve_$name.txt" 2>"$log/bench_serve_$name.err"; then
		ok "bench serve ${args[*]}"
	else
		bad "bench serve ${args[*]} (exit $?)"
		tail -5 "$log/bench_serve_$name.err"
	fi
	cat "$log/bench_serve_$name.txt"
done
done
done
gpu_done
