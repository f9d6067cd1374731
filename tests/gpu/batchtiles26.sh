#!/bin/bash
# On the GPU machine (issue #26): how many stages a split of the decode
# attention takes, seen from a batch of 16 conversations. A batched item
# splits its keys as the lone call does (batch invariance), by one rule
# (KVMEM_CUDA_DEC_MIN_TILES, 4 by default): at a 4096-key view a lone decode
# wants many short splits, 16 views in one launch want few long ones
# (kvmem_gpu_check --fp8 --bench on an H100, 2026-12-06: one layer over 16
# views of 4096 keys 0.083 ms at 4, 0.063 ms at 32; 16 lone calls 0.21 ms
# at 4, 0.69 ms at 32). Each setting applies to the lone session and the
# batch of the same run, as it must:
#
#   1. kvmem_gpu_check --fp8 (the kernels against their twins and the
#      batched decode against its lone calls);
#   2. kvmem bench batch, 16 conversations of 16K-45K tokens, 4096-token
#      views, fp8 at 4 and 16 stages, bf16 at 4 (bf16's trade was
#      measured in the twentieth session: benchmarks.md, "Batched decode at
#      16 rows");
#   3. 64 conversations of 4K-11K tokens, bf16 then fp8, at the default;
#   4. the PyTorch peer on this card (tools/bench/torch_batch_decode.py,
#      full caches: 1 and 16 at 32768 keys, 1 and 64 at 8192; an H200
#      only), then fp8 at 8 stages while time is left.
#
#   tests/gpu/batchtiles26.sh OUTDIR [SECONDS]   (default 560; logs in OUTDIR/batchtiles26.tar)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/batchtiles26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_begin batchtiles26 560 "${2:-}"
# 1.
gpu_fp8_check 60
# 2.
B16="--context 32k --budget 4096 --chunk 2048 --tokens 8 --sessions 1,16 --no-loop"
for t in 4 16; do
	KVMEM_CUDA_DEC_MIN_TILES=$t gpu_batch b32k_16_fp8_t$t 80 $B16 --kv-dtype fp8
done
# 3. (before bf16's 16: a short call keeps what the first call lacked)
B64="--context 8k --budget 4096 --chunk 2048 --tokens 8 --sessions 1,64 --no-loop"
gpu_batch b8k_64_bf16 90 $B64
gpu_batch b8k_64_fp8 90 $B64 --kv-dtype fp8
gpu_batch b32k_16_bf16_t4 80 $B16
# 4.
# 16 full caches of 32768 keys or 64 of 8192 are 77 GB of bf16 beside 16 GB
# of weights: an H200's, not an H100's.
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "${mib:-0}" -gt 100000 ]; then
	gpu_torch_peer 100 1,16:32768 1,64:8192
else
	echo "-- the PyTorch peer left out: its full caches (77 GB) and weights do not fit ${mib} MiB"
fi
KVMEM_CUDA_DEC_MIN_TILES=8 gpu_batch b32k_16_fp8_t8 80 $B16 --kv-dtype fp8
gpu_batch_summary
[ -n "${OUT:-}" ] && tar cf "$OUT/batchtiles26.tar" -C "$OUT" batchtiles26 && rm -rf "${OUT:?}/batchtiles26"
gpu_done
