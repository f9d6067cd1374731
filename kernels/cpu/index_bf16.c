// SPDX-License-Identifier: MIT
/*
 * The index's append over plain arrays (twin of kernels/cuda/index.cu):
 * the arithmetic of the workspace's kvmem_index_append (user/workspace/
 * index.c) token by token, with the summaries stored as the index dtype.
 * With KVMEM_DTYPE_F32 it gives the workspace index's bits; with
 * KVMEM_DTYPE_BF16 those values rounded once (the running sums stay fp32,
 * so nothing drifts). tests/unit/test_index_bf16.c checks both.
 */
#include <string.h>

#include "kernels/kernels_bf16.h"
#include "kvmem/kvmem.h"

static float get(const void *a, int dt, size_t i)
{
	return dt == KVMEM_DTYPE_BF16 ? kvmem_bf16_to_f32(((const uint16_t *)a)[i])
				      : ((const float *)a)[i];
}

static void put(void *a, int dt, size_t i, float v)
{
	if (dt == KVMEM_DTYPE_BF16)
		((uint16_t *)a)[i] = kvmem_f32_to_bf16(v);
	else
		((float *)a)[i] = v;
}

int kvmem_index_append_bf16(void *meank, void *kmin, void *kmax, void *sub, float *open_sum,
			    float *open_sub, const uint16_t *raw_k, int64_t first, int n,
			    const kvmem_score_geom *g)
{
	const int L = g->n_layers, H = g->n_kv_heads, D = g->head_dim, B = g->block;
	const int sub_len = B / 4, dt = g->index_dtype;

	if (L <= 0 || H <= 0 || D <= 0 || B < 4 || B % 4 || first < 0 || n < 0 ||
	    (!kmin != !kmax) || (dt != KVMEM_DTYPE_F32 && dt != KVMEM_DTYPE_BF16) ||
	    (first + n + B - 1) / B > g->cap_blocks)
		return kvmem_error(EINVAL, "index append: %d tokens after %lld into %lld blocks of %d "
				   "(%d layers, %d heads, head_dim %d)", n, (long long)first,
				   (long long)g->cap_blocks, B, L, H, D);
	for (int l = 0; l < L; l++)
		for (int h = 0; h < H; h++)
			for (int d = 0; d < D; d++) {
				const size_t o = ((size_t)l * H + h) * D + d;
				const size_t run = ((size_t)l * H + h) * g->cap_blocks;
				float sum = open_sum[o], ssum = open_sub ? open_sub[o] : 0.0f, lo = 0, hi = 0;

				if (kmin && first % B) {
					lo = get(kmin, dt, (run + first / B) * D + d);
					hi = get(kmax, dt, (run + first / B) * D + d);
				}
				for (int j = 0; j < n; j++) {
					const int64_t p = first + j, blk = p / B;
					const int t = (int)(p % B), u = t % sub_len;
					const float k = kvmem_bf16_to_f32(
						raw_k[(((size_t)l * n + j) * H + h) * D + d]);

					sum = t == 0 ? k : sum + k;
					if (kmin) {
						lo = t == 0 ? k : (k < lo ? k : lo);
						hi = t == 0 ? k : (k > hi ? k : hi);
					}
					ssum = u == 0 ? k : ssum + k;
					if (t == B - 1 || j == n - 1) {
						put(meank, dt, (run + blk) * D + d, sum / (float)(t + 1));
						if (kmin) {
							put(kmin, dt, (run + blk) * D + d, lo);
							put(kmax, dt, (run + blk) * D + d, hi);
						}
					}
					if (sub && (u == sub_len - 1 || j == n - 1))
						put(sub, dt, ((run + blk) * 4 + t / sub_len) * D + d,
						    ssum / (float)(u + 1));
				}
				open_sum[o] = sum;
				if (sub && open_sub)
					open_sub[o] = ssum;
			}
	return 0;
}
