#!/bin/bash
# On the GPU machine (issues #26, #24): the flash attention's split combine
# a warp a row instead of a block a row (kernels/cuda/attention.cu), which
# ncu put at 1.5 ms of a 256-token prefill chunk's 10.4 ms at the 8B
# geometry. The checks first (kvmem_gpu_check: every op against its twin;
# --attn-prefill: the new combine's bits against the block form's, then
# the prefill timings), then a short prompt's prefill both ways in the same
# run (bench step's stage-out phase in 256-token chunks, the plain forward
# beside the session; KVMEM_CUDA_COMBINE_BLOCK=1 is the block form), then
# the census of its kernels.
#
#   tests/gpu/combine26.sh OUTDIR [SECONDS]   (logs in OUTDIR/combine26;
#   ONLY_STEP=1: the bench step runs alone)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/combine26.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_begin combine26 400 "${2:-}"
if [ -z "${ONLY_STEP:-}" ]; then
	echo "== kvmem_gpu_check"
	timeout "$(gpu_left 150)" "$G" >"$log/check.log" 2>&1
	rc=$?
	grep -E "^FAIL|passed, .* failed" "$log/check.log"
	count "$log/check.log" $rc
	gpu_check "$(gpu_left 100)" attn_prefill.log --attn-prefill
fi
for kv in bf16 fp8; do
for form in warp block; do
	echo "== combine a $form a row: kvmem bench step --only stageout --prefill 2048 --chunk 256 --kv-dtype $kv"
	( [ $form = block ] && export KVMEM_CUDA_COMBINE_BLOCK=1
	  timeout "$(gpu_left 90)" "$K" bench step --backend cuda --only stageout --prefill 2048 \
		--chunk 256 --kv-dtype $kv >"$log/step_${kv}_$form.txt" 2>&1 ) &&
		ok "bench step $kv, $form" || bad "bench step $kv, $form"
	grep -E "plain forward|session over the workspace, the pool used" "$log/step_${kv}_$form.txt"
done
done
if [ -z "${ONLY_STEP:-}" ]; then
	echo "== tests/gpu/prefill_census.sh 1024 256"
	OUT=$log timeout "$(gpu_left 120)" tests/gpu/prefill_census.sh 1024 256 2>&1 | head -8
fi
gpu_done
