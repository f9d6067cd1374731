#!/bin/bash
# On the GPU machine (issue #26): where a batched decode pass's time goes.
# From the repo root (gpu_setup unpacks the bundle):
#
#   tests/gpu/prof26.sh OUTDIR [SECONDS]
#
# kvmem bench batch --backend cuda --preset 8b (histories 256-716 tokens,
# tensor-core GEMMs on, as tests/gpu/host26.sh runs it) at 16 and then 64
# sessions, each in its own process with KVMEM_CUDA_BATCH_PROFILE=1: the
# backend prints, when it closes, each op's share of a pass (events on the
# stream), the host's time to queue a pass and its wait in the sync
# (user/backend/cuda_fwd_batch.c). nsys does not run on the GPU machine
# (KINDS.md), so this is the profile. SECONDS (default 120) bounds the
# whole; logs in OUTDIR/prof26.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/prof26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_end=$(($(date +%s) + ${2:-120}))
gpu_setup prof26 build-gpu
gpu_need "$K"
BENCH="bench batch --backend cuda --preset 8b --context 512 --tokens 8 --chunk 256 --json"
for n in 16 64; do
	echo "== KVMEM_CUDA_BATCH_PROFILE=1 KVMEM_CUDA_GEMM_TC=1 kvmem $BENCH --sessions $n"
	if KVMEM_CUDA_BATCH_PROFILE=1 KVMEM_CUDA_GEMM_TC=1 timeout "$(gpu_left 50)" "$K" $BENCH \
		--sessions "$n" >"$log/batch$n.json" 2>"$log/batch$n.err"; then
		ok "bench batch, $n sessions, profiled"
	else
		bad "bench batch, $n sessions, profiled (exit $?)"
		tail -3 "$log/batch$n.err"
	fi
	grep -A16 'cuda batched forward profile' "$log/batch$n.err"
	grep -o '"median_batch_tokens_per_s": *[0-9.]*\|"batch_[a-z_]*ms": *[0-9.]*' \
		"$log/batch$n.json" | tr '\n' ' '
	echo
done
gpu_done
