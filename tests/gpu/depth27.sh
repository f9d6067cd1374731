#!/bin/bash
# On the GPU machine (issues 27 and 26): more loads in flight a warp.
# From the repo root (gpu_setup unpacks the bundle):
#
#   tests/gpu/depth27.sh OUTDIR [SECONDS]
#
#   1. kvmem_gpu_check --fp8 --bench: the fp8 kernels against their twins
#      (decode over fp8 in registers at 3 and 4 tiles a warp: the bits of
#      2), then one layer's decode attention at 32K / 128K keys, each depth
#      beside the bf16 view's;
#   2. kvmem_gpu_check --gemm-tc: the tensor-core GEMM's checks (x's loads
#      issued with the weights', gemm_tc_xpre: the same bits) and a
#      layer's four GEMMs at 1, 16 and 64 rows in each form;
#   3. kvmem bench step --only step,decode (32K view over 49K tokens) and
#      --only decode (128K over 144K): bf16, fp8 at depth 2, fp8 at
#      DEPTH (default 3).
#
# SECONDS (default 400) bounds the whole; logs in OUTDIR/depth27.tar.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/gpu/depth27.sh OUTDIR [SECONDS]}
. tests/gpu/lib.sh
gpu_end=$(($(date +%s) + ${2:-400}))
gpu_setup depth27 build-gpu
gpu_need "$K" "$G"
export KVMEM_CEILINGS_HELD=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
D=${DEPTH:-3}

gpu_fp8_bench 90
grep -E "^  fp8 view|tiles a warp" "$log/fp8_check.log" | grep -v "^PASS"
[ "${GEMM:-1}" = 1 ] && gpu_check "$(gpu_left 120)" gemm_tc.log --gemm-tc
[ "${STEP:-1}" = 1 ] && {
	gpu_step32k step_bf16 bf16
	gpu_step32k step_fp8 fp8
	gpu_step32k step_fp8_d$D fp8 KVMEM_CUDA_FP8_REG_DEPTH=$D
	gpu_step step128k_bf16 bf16 147456 131072 decode 60
	gpu_step step128k_fp8 fp8 147456 131072 decode 60
	gpu_step step128k_fp8_d$D fp8 147456 131072 decode 60 KVMEM_CUDA_FP8_REG_DEPTH=$D
	grep -hE "^decode|tok/s" "$log"/step*.log | head -40
}
# The 16-row GEMM's loop as compiled: where its x loads sit against the mma.
for f in "$G" "$B"/lib/libkvmem*.so*; do
	cuobjdump -sass -fun '_Z14gemm_tc_kernelILi2ELi1ELi4ELb0ELb0ELb0EEvPviPKvPKtfS4_iiii' "$f" \
		2>/dev/null | grep -E "LDG|HMMA|BRA|ISETP" >"$log/sass_nt2.txt" && [ -s "$log/sass_nt2.txt" ] && break
done
wc -l "$log/sass_nt2.txt"
[ -n "${OUT:-}" ] && tar cf "$OUT/depth27.tar" -C "$OUT" depth27 && rm -rf "${OUT:?}/depth27"
gpu_done
