#!/bin/bash
# The one-row GEMM (kernels/cuda/gemv.cu) on the GPU machine: the first
# kernel against the split-K one, checked and timed in one run.
#
#   tests/gpu/gemv_sweep.sh [BUILD] [nosan]    BUILD: default build-gpu
#
# Run from the repository root with the bundle of tools/gpu/bundle.sh
# (carry build-gpu/bundle.tar.xz; it is unpacked here), or with a build
# folder that has gpu/kvmem_gpu_check[-static].
#
# 1. kvmem_gpu_check --gemv (tests/gpu/check_gemv.c): odd shapes in every
#    mode, then Qwen3-8B's decode shapes (qkv 4096->6144, o_proj 4096->4096
#    +=, gate|up 4096->24576, down 12288->4096 +=, lm_head 4096->151936) on
#    fresh random inputs: cuBLASLt, the first kernel, the split kernel (its
#    own split and each forced one) against the CPU twin within
#    Documentation/kernels.md's tolerance; split ks1 bit for bit the first
#    kernel; the split it picks bit for bit one of the forced ones; a graph
#    replay of it bit for bit the plain call. Then each shape's time per
#    launch in a graph of 36 launches over different weights (cold in the
#    L2, as in decode) and as single launches, in microseconds and as a
#    fraction of the copy rate measured in the same run, and one decode
#    token's GEMVs (36 layers + lm_head) with each kernel.
# 2. compute-sanitizer memcheck and racecheck over --gemv --quick (the odd
#    shapes: rows past the end, splits past the input, the shared-memory
#    sum of the split kernel); "nosan" skips them.
#
# Ends with "N passed, N failed": each check line of step 1 is one, each
# sanitizer run is one. Logs in $OUT/gemv_sweep/ when OUT is set (the run
# tool's folder), else in a temporary folder. About 30-60 s.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/gpu/lib.sh
gpu_setup gemv_sweep "$@"

gpu_check 150 gemv.log --gemv

gpu_sanitize --gemv --quick
gpu_done
