// SPDX-License-Identifier: MIT
/*
 * CPU twins of decode's fused CUDA ops (kernels/kernels_bf16.h):
 * each is the composition of the unfused twins it replaces, which is what
 * the CUDA kernel computes for one row in a single launch.
 */
#include "kernels/kernels_bf16.h"
#include "kvmem/kvmem.h"

int kvmem_norm_gemv_bf16(void *y, int mode, const float *x, const uint16_t *norm_w, float eps,
			 const uint16_t *w, uint16_t *h, int n, int in, int out)
{
	if (n < 0 || in <= 0 || out <= 0)
		return kvmem_error(EINVAL, "rmsnorm + gemv: bad shape %d x %d -> %d", n, in, out);
	kvmem_rmsnorm_bf16(h, x, norm_w, n, in, eps);
	return kvmem_gemm_bf16(y, mode, h, w, n, in, out);
}

int kvmem_norm_gemv_swiglu_bf16(uint16_t *act, const float *x, const uint16_t *norm_w, float eps,
				const uint16_t *w, uint16_t *h, uint16_t *gu, int n, int in,
				int inter)
{
	int rc;

	if (n < 0 || in <= 0 || inter <= 0 || inter > INT32_MAX / 2)
		return kvmem_error(EINVAL, "rmsnorm + gemv + swiglu: bad shape %d x %d -> 2 x %d", n,
				   in, inter);
	kvmem_rmsnorm_bf16(h, x, norm_w, n, in, eps);
	if ((rc = kvmem_gemm_bf16(gu, KVMEM_GEMM_BF16, h, w, n, in, 2 * inter)) < 0)
		return rc;
	kvmem_swiglu_bf16(act, gu, gu + inter, n, inter, 2 * inter);
	return 0;
}
