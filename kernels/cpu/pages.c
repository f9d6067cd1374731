// SPDX-License-Identifier: MIT
/*
 * A forward pass's rows into page layout (formats.md's page: K then V,
 * each [n_kv_heads][block][head_dim], bf16): the twin of the cuda
 * backend's kvmem_cuda_rows_to_pages_bf16, which writes a chunk's rows
 * straight into the pinned host pool slots the pages live in, and the
 * pager source's own copy when rows come down as rows. A pure copy: the
 * bits of every row are those it came with.
 */
#include <string.h>

#include "kernels/kernels_bf16.h"

void kvmem_rows_to_pages_bf16(void *const *pages, int t0, int n, const uint16_t *k,
			      const uint16_t *v, int H, int B, int D)
{
	const size_t half = (size_t)H * B * D, kw = (size_t)H * D;

	for (int j = 0; j < n; j++) {
		const int at = t0 + j, t = at % B;
		uint16_t *pg = pages[at / B];

		for (int h = 0; h < H; h++) {
			const size_t row = ((size_t)h * B + t) * D;

			memcpy(pg + row, k + j * kw + (size_t)h * D, (size_t)D * 2);
			memcpy(pg + half + row, v + j * kw + (size_t)h * D, (size_t)D * 2);
		}
	}
}
