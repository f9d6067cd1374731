#!/bin/bash
# On the GPU machine (issues #26 and #27, 2026-12-03): the checks and the
# first measurements of two kernel changes, each beside the rule before in
# the same run:
#
#   - the tensor-core GEMM: --gemm-tc (the twin, row bits for every n),
#     test_ws_batch on cuda with it on, bench batch 1/16/64 and the shapes'
#     sweep (--gemm-tc-shapes). (Its first run also measured a form with
#     several tiles a block, KVMEM_CUDA_GEMM_TC_SP: slower at every shape,
#     not kept; benchmarks.md, "The ninth session's GPU calls".)
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
gpu_fp8_bench 40
gpu_unit test_fp8_session 25
gpu_unit test_ws_batch 40 KVMEM_CUDA_GEMM_TC=1

gpu_step32k step_bf16 bf16
gpu_step32k step_fp8 fp8

gpu_batch batch 45 --context 512 --tokens 8 --chunk 256 --sessions 1,16,64
gpu_check "$(gpu_left 10)" gemm_tc_shapes.log --gemm-tc-shapes
gpu_done
