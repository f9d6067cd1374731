#!/bin/bash
# On an H200 (issue #26): kvmem's batched decode at 64 conversations of 8K
# tokens (and 16 of 32K) over bf16 and over fp8 views, beside PyTorch's
# graphed batched decode of the same geometry over full caches
# (tools/bench/torch_batch_decode.py) in the same call: the issue's "peer in
# the same run" row, which stood at 0.96x (bf16 views) at 64 x 8K in the
# eleventh session, before kvmem's batched decode over fp8 views existed.
# The peer's full caches (64 x 8192 or 16 x 32768 keys: 77 GB of bf16) and
# the weights need more than an H100's 80 GB; on an H100 both sides run at
# the largest histories whose full caches fit beside the peer's weights:
# 64 conversations of 6K (58 GB of KV) and 16 of 16K (39 GB), kvmem over fp8
# views at 8 stages as kvmem serve batches them.
#
#   tests/gpu/peer26.sh OUTDIR [SECONDS]   (default 540; logs in OUTDIR/peer26.tar)
#   ONLY64=1: the 64 x 8K rows alone (64 x 6K on an H100), fp8 at 8 stages a
#   split as kvmem serve batches it (the row behind the peer; 330 s)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/peer26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_begin peer26 540 "${2:-}"
# The rows' summary, the logs as one tar (the run tool brings few files back), the verdict.
finish() {
	gpu_batch_summary
	[ -n "${OUT:-}" ] && tar cf "$OUT/peer26.tar" -C "$OUT" peer26 && rm -rf "${OUT:?}/peer26"
	gpu_done
}
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
B64="--context 8k --budget 4096 --chunk 2048 --tokens 8 --sessions 1,64 --no-loop"
B16="--context 32k --budget 4096 --chunk 2048 --tokens 8 --sessions 1,16 --no-loop"
if [ "${mib:-0}" -le 100000 ]; then
	B64=${B64/8k/6k}
	B16=${B16/32k/16k}
	KVMEM_CUDA_DEC_MIN_TILES=8 gpu_batch b6k_64_fp8_t8 110 $B64 --kv-dtype fp8
	gpu_torch_peer 110 1,64:6144
	if [ -z "${ONLY64:-}" ]; then
		KVMEM_CUDA_DEC_MIN_TILES=8 gpu_batch b16k_16_fp8_t8 90 $B16 --kv-dtype fp8
		gpu_torch_peer 110 1,16:16384
	fi
	finish
	exit
fi
if [ -n "${ONLY64:-}" ]; then
	KVMEM_CUDA_DEC_MIN_TILES=8 gpu_batch b8k_64_fp8_t8 100 $B64 --kv-dtype fp8
else
	gpu_batch b8k_64_fp8 90 $B64 --kv-dtype fp8
fi
gpu_batch b8k_64_bf16 90 $B64
if [ "${mib:-0}" -gt 100000 ]; then
	if [ -n "${ONLY64:-}" ]; then
		gpu_torch_peer 110 1,64:8192
	else
		gpu_torch_peer 110 1,64:8192 1,16:32768
	fi
else
	echo "-- the PyTorch peer left out: its full caches (77 GB) and weights do not fit ${mib} MiB"
fi
if [ -n "${ONLY64:-}" ]; then
	finish
	exit
fi
gpu_batch b32k_16_fp8 80 $B16 --kv-dtype fp8
gpu_batch b32k_16_bf16 80 $B16
# The decode split's least stages at 8 (4 and 16 measured on an H100 on
# 2026-12-06: benchmarks.md, "Batched steps over fp8 views on an H100").
KVMEM_CUDA_DEC_MIN_TILES=8 gpu_batch b32k_16_fp8_t8 80 $B16 --kv-dtype fp8
finish
