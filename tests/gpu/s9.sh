#!/bin/bash
# On the GPU machine (issues #26 and #27, 2026-12-03): the checks and the
# first measurements of two kernel changes, each beside the rule before in
# the same run:
#
#   - the tensor-core GEMM's warps a tile's input is split over inside a
#     block (KVMEM_CUDA_GEMM_TC_SP; sp 1: 8 tiles a block, each warp over
#     the whole input, so the block's warps read the same x): --gemm-tc
#     (the twin; row bits for every n, sp 1, 2 and 4 among them), the
#     shapes' sweep (--gemm-tc-shapes), test_ws_batch on cuda with sp 1,
#     and bench batch 1/16/64 with sp by the rule (= ks) and sp 1;
#   - decode attention over fp8 K/V converts each warp's own keys with no
#     block barrier between stages, and the fp8 put kernel shares a token's
#     rotary angles across its KV heads: --fp8 --bench (the twins, the fp8
#     decode's bits against bf16 over the dequantised view, and decode at
#     32K / 128K keys fp8 beside bf16), test_fp8_session, and the session's
#     warm step and decode at a 32K view, bf16 then fp8.
#
#   tests/gpu/s9.sh OUTDIR [SECONDS]      (default 400; logs in OUTDIR/s9)
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/s9.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_end=$(($(date +%s) + ${2:-400}))
gpu_setup s9 build-gpu
gpu_need "$K"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

gpu_check "$(gpu_left 30)" gemm_tc.log --gemm-tc
echo "== kvmem_gpu_check --fp8 --bench"
timeout "$(gpu_left 40)" "$G" --fp8 --bench >"$log/fp8_check.log" 2>&1
rc=$?
grep -E '^(rematerial|decode attention|FAIL)|passed' "$log/fp8_check.log"
count "$log/fp8_check.log" $rc
gpu_unit test_fp8_session 25
gpu_unit test_ws_batch 40 "KVMEM_CUDA_GEMM_TC=1 KVMEM_CUDA_GEMM_TC_SP=1"

gpu_step32k step_bf16 bf16
gpu_step32k step_fp8 fp8

BATCH="bench batch --backend cuda --preset 8b --context 512 --tokens 8 --chunk 256 --json --sessions 1,16,64"
for sp in 0 1; do
	echo "== KVMEM_CUDA_GEMM_TC_SP=$sp KVMEM_CUDA_GEMM_TC=1 kvmem $BATCH"
	if KVMEM_CUDA_GEMM_TC_SP=$sp KVMEM_CUDA_GEMM_TC=1 timeout "$(gpu_left 45)" "$K" $BATCH \
		>"$log/batch_sp$sp.json" 2>"$log/batch_sp$sp.err"; then
		ok "bench batch, KVMEM_CUDA_GEMM_TC_SP=$sp"
	else
		bad "bench batch, KVMEM_CUDA_GEMM_TC_SP=$sp"
	fi
	grep -o '"sessions": *[0-9]*\|"median_batch_tokens_per_s": *[0-9.]*\|"median_alone_tokens_per_s": *[0-9.]*' \
		"$log/batch_sp$sp.json" | tr '\n' ' '
	echo
done
gpu_check "$(gpu_left 10)" gemm_tc_shapes.log --gemm-tc-shapes
grep -E ' sp ' "$log/gemm_tc_shapes.log"
gpu_done
