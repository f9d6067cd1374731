/* SPDX-License-Identifier: MIT */
/*
 * Decode's fused ops (kernels/cuda/gemv.cu: kvmem_cuda_norm_gemv_bf16,
 * kvmem_cuda_norm_gemv_swiglu_bf16; kernels/cuda/qkv.cu:
 * kvmem_cuda_qk_norm_rope_scatter_bf16) in kvmem_gpu_check (--fuse, and in the
 * full run): against their twins (the compositions of the unfused twins) on
 * fresh random inputs at Qwen3-8B's decode shapes and odd ones, bit for bit
 * against the unfused CUDA ops at every split, then (not under --quick)
 * their times against the unfused ops'.
 */
#ifndef KVMEM_TESTS_GPU_CHECK_FUSE_H
#define KVMEM_TESTS_GPU_CHECK_FUSE_H

void check_fuse(void);

#endif
