#!/bin/bash
# On the GPU machine (issue #26, 2026-12-02): measurements for two rules of
# the decode kernels, each against the rule before in the same run.
#
#   1. kvmem_gpu_check --gemm-tc-shapes: the tensor-core GEMM at each 8B
#      layer shape, 1/16/64 rows, every split ks and weight tiles a warp mt
#      forced in turn (weights GB/s), beside the lone decode's GEMV;
#   2. decode attention v5's least stages a split (DEC_MIN_TILES, 4): a lone
#      decode of the 8B geometry at 1K-8K keys (kvmem bench engine), and the
#      batched decode of 16 and 64 sessions (kvmem bench batch, as
#      host26.sh), with KVMEM_CUDA_DEC_MIN_TILES=1 (the rule before) and
#      with the default.
#
#   tests/gpu/tune26.sh OUTDIR [SECONDS]      (default 200; logs in OUTDIR/tune26)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/tune26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_end=$(($(date +%s) + ${2:-200}))
gpu_setup tune26 build-gpu
gpu_need "$K"
gpu_check "$(gpu_left 60)" gemm_tc_shapes.log --gemm-tc-shapes
ENGINE="bench engine --backend cuda --preset 8b --prefill 8k --decode 1k,2k,4k,8k --decode-tokens 64 --chunk 4096"
BATCH="bench batch --backend cuda --preset 8b --context 512 --tokens 8 --chunk 256 --json --sessions 1,16,64"
for m in 1 0; do
	echo "== KVMEM_CUDA_DEC_MIN_TILES=$m kvmem $ENGINE"
	if KVMEM_CUDA_DEC_MIN_TILES=$m timeout "$(gpu_left 40)" "$K" $ENGINE \
		>"$log/engine_min$m.log" 2>&1; then
		ok "bench engine, KVMEM_CUDA_DEC_MIN_TILES=$m"
	else
		bad "bench engine, KVMEM_CUDA_DEC_MIN_TILES=$m"
	fi
	grep -A6 '^decode at' "$log/engine_min$m.log"
done
for m in 1 0; do
	echo "== KVMEM_CUDA_DEC_MIN_TILES=$m KVMEM_CUDA_GEMM_TC=1 kvmem $BATCH"
	if KVMEM_CUDA_DEC_MIN_TILES=$m KVMEM_CUDA_GEMM_TC=1 timeout "$(gpu_left 45)" "$K" $BATCH \
		>"$log/batch_min$m.json" 2>"$log/batch_min$m.err"; then
		ok "bench batch, KVMEM_CUDA_DEC_MIN_TILES=$m"
	else
		bad "bench batch, KVMEM_CUDA_DEC_MIN_TILES=$m"
	fi
	grep -o '"sessions": *[0-9]*\|"median_batch_tokens_per_s": *[0-9.]*\|"median_alone_tokens_per_s": *[0-9.]*' \
		"$log/batch_min$m.json" | tr '\n' ' '
	echo
done
gpu_done
