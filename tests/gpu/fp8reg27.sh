#!/bin/bash
# On the GPU machine (issue 27): decode attention over fp8 in registers
# (attention_fp8.cu, the default) beside the tile form (KVMEM_CUDA_FP8_REG=0)
# and bf16, each with its peers in the same run. From the repo root
# (gpu_setup unpacks the bundle):
#
#   tests/gpu/fp8reg27.sh OUTDIR [SECONDS]
#
#   1. kvmem_gpu_check --fp8 --bench: the fp8 kernels against their twins
#      (the register form within a tolerance of v5 over the rows
#      dequantised), then one layer's decode attention at 32K / 128K keys,
#      every form beside the bf16 view's;
#   2. test_fp8_session on cuda (the register form, the default: the
#      restated exactness invariant, paged and full-context session);
#   3. kvmem bench step --only step,decode (32K view over 49K tokens):
#      bf16, fp8 in registers (the default), fp8's tile form;
#   4. the same --only decode in a 128K view over 144K tokens: bf16, fp8
#      in registers.
#
# SECONDS (default 250) bounds the whole; logs in OUTDIR/fp8reg27.tar.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/fp8reg27.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_end=$(($(date +%s) + ${2:-250}))
gpu_setup fp8reg27 build-gpu
gpu_need "$K"
export KVMEM_CEILINGS_HELD=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

gpu_fp8_bench 40
grep -E "^  fp8 view|fp8_reg" "$log/fp8_check.log"
gpu_unit test_fp8_session 60
gpu_step32k step_bf16 bf16
gpu_step32k step_fp8 fp8
gpu_step32k step_fp8tile fp8 KVMEM_CUDA_FP8_REG=0
# decode in a 128K view (the issue's second decode row), bf16 then fp8 in registers
gpu_step step128k_bf16 bf16 147456 131072 decode 60
gpu_step step128k_fp8 fp8 147456 131072 decode 60
# The run tool brings back eight files a call: the logs as one tar.
[ -n "${OUT:-}" ] && tar cf "$OUT/fp8reg27.tar" -C "$OUT" fp8reg27 && rm -rf "${OUT:?}/fp8reg27"
gpu_done
