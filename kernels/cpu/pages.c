// SPDX-License-Identifier: MIT
/*
 * A forward pass's rows into page layout (formats.md's page: K then V,
 * each [n_kv_heads][block][head_dim], bf16): the twin of the cuda
 * backend's kvmem_cuda_rows_to_pages_bf16, which writes a chunk's rows
 * straight into the pinned host pool slots the pages live in, and the
 * pager source's own copy when rows come down as rows. A pure copy: the
 * bits of every row are those it came with. The fp8 form quantises them.
 */
#include <string.h>

#include "kernels/kernels_bf16.h"
#include "kernels/kernels_fp8.h"

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

/* The same into fp8 pages (K bytes, V bytes, K scales, V scales:
 * kernels_fp8.h), each row quantised on its own as the pager's own copy
 * quantises rows: the twin of kvmem_cuda_rows_to_pages_fp8. */
void kvmem_rows_to_pages_fp8(void *const *pages, int t0, int n, const uint16_t *k,
			     const uint16_t *v, int H, int B, int D)
{
	const size_t half = (size_t)H * B * D, kw = (size_t)H * D;
	float wide[1024];	/* head_dim <= 1024 (config.json's bound) */

	for (int j = 0; j < n; j++) {
		const int at = t0 + j, t = at % B;
		uint8_t *pg = pages[at / B];
		float *sc = (float *)(pg + 2 * half);

		for (int h = 0; h < H; h++) {
			const size_t row = (size_t)h * B + t;

			kvmem_bf16_to_f32_n(wide, k + j * kw + (size_t)h * D, (size_t)D);
			kvmem_fp8_quant_row(pg + row * D, &sc[row], wide, D);
			kvmem_bf16_to_f32_n(wide, v + j * kw + (size_t)h * D, (size_t)D);
			kvmem_fp8_quant_row(pg + half + row * D, &sc[(size_t)H * B + row], wide, D);
		}
	}
}
