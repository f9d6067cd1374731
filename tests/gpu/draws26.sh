#!/bin/bash
# On the GPU machine (issue #26): where a batched decode step's host time
# goes (KVMEM_SESSION_BATCH_PROFILE) at 16 and 64 conversations of short
# histories, then the issue's rows over fp8 views as `kvmem serve` runs them
# (KVMEM_CUDA_GEMM_TC=1, KVMEM_CUDA_DEC_MIN_TILES=8): 16 conversations of
# 16K-45K tokens and 64 of 4K-11K, 4096-token views; then test_ws_batch on
# cuda (the batch's draws on the pool give the lone stream's tokens).
#
#   tests/gpu/draws26.sh OUTDIR [SECONDS]   (default 450; logs in OUTDIR/draws26.tar)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/draws26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_begin draws26 450 "${2:-}"
export KVMEM_CUDA_DEC_MIN_TILES=8
for b in 16 64; do
	echo "== KVMEM_SESSION_BATCH_PROFILE=1 kvmem bench batch ... --context 2k --sessions $b"
	KVMEM_SESSION_BATCH_PROFILE=1 KVMEM_CUDA_GEMM_TC=1 timeout "$(gpu_left 60)" "$K" bench batch \
		--backend cuda --preset 8b --json --context 2k --budget 4096 --chunk 2048 --tokens 32 \
		--sessions "$b" --no-loop --kv-dtype fp8 >"$log/prof$b.json" 2>"$log/prof$b.err"
	grep -A6 "KVMEM_SESSION_BATCH_PROFILE" "$log/prof$b.err"
done
gpu_batch b32k_16_fp8_t8 90 --context 32k --budget 4096 --chunk 2048 --tokens 8 --sessions 1,16 \
	--no-loop --kv-dtype fp8
gpu_batch b8k_64_fp8_t8 100 --context 8k --budget 4096 --chunk 2048 --tokens 8 --sessions 1,64 \
	--no-loop --kv-dtype fp8
gpu_batch_summary
unset KVMEM_CUDA_DEC_MIN_TILES
gpu_unit test_ws_batch 120
[ -n "${OUT:-}" ] && tar cf "$OUT/draws26.tar" -C "$OUT" draws26 && rm -rf "${OUT:?}/draws26"
gpu_done
