#!/bin/bash
# On the GPU machine (issues #26, #27): many conversations over fp8 views in
# one batched forward. Until 2026-12-05 the cuda backend refused a batched
# forward over fp8 views ("no batched forward over fp8 views yet"), so a
# server with --kv-dtype fp8 decoded its conversations one by one.
#
#   1. kvmem_gpu_check --fp8 --bench: every fp8 kernel against its twin,
#      the batched put and the batched register decode against their lone
#      calls bit for bit (check_fp8_batch.c), and one layer's batched
#      decode over 16 views of 4096 and 32768 keys, fp8 beside bf16;
#   2. test_ws_batch on cuda (test_batch_fp8: batch invariance and the
#      exactness invariant over fp8 views), test_fp8_session on cuda;
#   3. kvmem bench batch at the 8B geometry, 16 conversations of 16K-45K
#      tokens (406K) with a 4096-token view beside one alone: bf16, then
#      fp8 (--kv-dtype fp8), each with its own lone session in the run;
#   4. the same at 64 conversations of 4K-11K tokens, fp8 (bf16's figure
#      from earlier calls is beside it in benchmarks.md), while time is left.
#
#   tests/gpu/fp8batch27.sh OUTDIR [SECONDS]     (default 560; logs in OUTDIR/fp8batch)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/fp8batch27.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_begin fp8batch 560 "${2:-}"
# 1.
gpu_fp8_check 90 --bench
# 2.
gpu_unit test_ws_batch 90
gpu_unit test_fp8_session 90
# 3.
B16="--context 32k --budget 4096 --chunk 2048 --tokens 8 --sessions 1,16 --no-loop"
gpu_batch b32k_16_bf16 170 $B16
gpu_batch b32k_16_fp8 170 $B16 --kv-dtype fp8
# 4.
gpu_batch b8k_64_fp8 150 --context 8k --budget 4096 --chunk 2048 --tokens 8 --sessions 1,64 \
	--no-loop --kv-dtype fp8
# The run tool brings back few files a call: the logs as one tar.
[ -n "${OUT:-}" ] && tar cf "$OUT/fp8batch.tar" -C "$OUT" fp8batch && rm -rf "${OUT:?}/fp8batch"
gpu_done
