// SPDX-License-Identifier: MIT
/* Running sums of raw K per KV head: what Mean-K divides by the block length. */
#include "kernels/kernels.h"

void kvmem_meank_accumulate(float *sum, const float *k, int n, int n_kv_heads, int head_dim)
{
	size_t row = (size_t)n_kv_heads * head_dim;

	for (int t = 0; t < n; t++)
		for (size_t e = 0; e < row; e++)
			sum[e] += k[t * row + e];
}
