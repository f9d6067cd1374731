// SPDX-License-Identifier: MIT
/*
 * A page source in host memory: raw K and V of every block, every layer,
 * allocated one block (all layers) at a time. The stand-in for the tiered
 * pager, with the same ops.
 *
 * Its pages are fp32, or bf16 for a backend whose rows are bf16 (a GPU's):
 * widening them to fp32 kept the same values in twice the bytes, which at
 * the 8B geometry is 295 KB a token instead of 147 KB, and sixteen 32K
 * conversations (406K tokens) outgrew a 128 GiB host (issue #26).
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kvmem/kvmem.h"
#include "kvmem/source.h"
#include "util/grow.h"

struct mem_source {
	int n_layers, n_kv_heads, head_dim, block;
	uint32_t dtype;		/* KVMEM_DTYPE_F32 or KVMEM_DTYPE_BF16 */
	size_t page_bytes;	/* one K (or V) page: H * B * D values of dtype */
	char **blocks;		/* [cap] -> [L][2][H][B][D] of dtype */
	int **fill;		/* [cap] -> [L] tokens written */
	size_t cap;
};

static char *page(struct mem_source *m, int64_t b, int layer, int is_v)
{
	return m->blocks[b] + ((size_t)layer * 2 + is_v) * m->page_bytes;
}

/* Value i of a page, d of them, from fp32 (rounded to the nearest even
 * bf16 on a bf16 source: exact for a bf16 backend's widened rows). */
static void put_f32(const struct mem_source *m, char *pg, size_t i, const float *x, int d)
{
	if (m->dtype == KVMEM_DTYPE_BF16)
		kvmem_f32_to_bf16_n((uint16_t *)pg + i, x, d);
	else
		memcpy((float *)pg + i, x, d * sizeof(float));
}

/* The same from bf16 (verbatim on a bf16 source, widened on fp32). */
static void put_bf16(const struct mem_source *m, char *pg, size_t i, const uint16_t *x, int d)
{
	if (m->dtype == KVMEM_DTYPE_BF16)
		memcpy((uint16_t *)pg + i, x, d * sizeof(uint16_t));
	else
		kvmem_bf16_to_f32_n((float *)pg + i, x, d);
}

/* Block b's pages, made on demand. */
static int have_block(struct mem_source *m, int64_t b)
{
	if ((size_t)b >= m->cap) {
		size_t c1 = m->cap, c2 = m->cap;

		/* Both arrays by one count; new entries NULL. */
		if (kvmem_grow(&m->blocks, sizeof(*m->blocks), (size_t)b + 1, &c1, 64) ||
		    kvmem_grow(&m->fill, sizeof(*m->fill), (size_t)b + 1, &c2, 64))
			return kvmem_error(ENOMEM, "page source: out of memory for %lld blocks",
					   (long long)b + 1);
		m->cap = c1;
	}
	if (!m->blocks[b]) {
		m->blocks[b] = malloc((size_t)m->n_layers * 2 * m->page_bytes);
		m->fill[b] = calloc((size_t)m->n_layers, sizeof(int));
		if (!m->blocks[b] || !m->fill[b]) {
			free(m->blocks[b]);
			free(m->fill[b]);
			m->blocks[b] = NULL;
			m->fill[b] = NULL;
			return kvmem_error(ENOMEM, "page source: out of memory for block %lld", (long long)b);
		}
	}
	return 0;
}

static int mem_write(void *ctx, int64_t b, int layer, int t0, int n, const float *k,
		     const float *v)
{
	struct mem_source *m = ctx;
	const int H = m->n_kv_heads, d = m->head_dim;

	if (b < 0 || layer < 0 || layer >= m->n_layers || t0 < 0 || n < 0 || t0 + n > m->block)
		return kvmem_error(EINVAL, "page source: bad write block %lld layer %d tokens %d+%d",
				 (long long)b, layer, t0, n);
	if (have_block(m, b))
		return kvmem_fail();
	/* In order, or again from an earlier token (a caller rewinding its
	 * history); never past a gap. */
	if (t0 > m->fill[b][layer])
		return kvmem_error(EINVAL, "page source: block %lld layer %d written at token %d, %d are "
				   "there: tokens must come in order", (long long)b, layer, t0,
				   m->fill[b][layer]);
	for (int h = 0; h < H; h++) {
		size_t at = ((size_t)h * m->block + t0) * d;

		for (int j = 0; j < n; j++) {
			put_f32(m, page(m, b, layer, 0), at + (size_t)j * d,
				k + ((size_t)j * H + h) * d, d);
			put_f32(m, page(m, b, layer, 1), at + (size_t)j * d,
				v + ((size_t)j * H + h) * d, d);
		}
	}
	m->fill[b][layer] = t0 + n;
	return 0;
}

/* A forward pass's rows whole (f32 or bf16, into the source's dtype as
 * put_f32 and put_bf16 say), the layers on the OpenMP threads: each
 * layer's pages are its own. */
static int mem_write_rows(void *ctx, int64_t p0, int n, const void *k, const void *v,
			  uint32_t dtype)
{
	struct mem_source *m = ctx;
	const int H = m->n_kv_heads, d = m->head_dim, B = m->block;
	const size_t kw = (size_t)H * d;
	int64_t b0, b1;

	if (dtype != KVMEM_DTYPE_F32 && dtype != KVMEM_DTYPE_BF16)
		return kvmem_error(ENOTSUP, "page source: rows of dtype %u (f32 or bf16 only)", dtype);
	if (p0 < 0 || n < 0)
		return kvmem_error(EINVAL, "page source: bad rows write: tokens %lld+%d",
				   (long long)p0, n);
	if (!n)
		return 0;
	b0 = p0 / B;
	b1 = (p0 + n - 1) / B;
	for (int64_t b = b0; b <= b1; b++)
		if (have_block(m, b))
			return kvmem_fail();
	for (int l = 0; l < m->n_layers; l++)
		if (p0 % B > m->fill[b0][l])
			return kvmem_error(EINVAL, "page source: block %lld layer %d written at token "
					   "%d, %d are there: tokens must come in order",
					   (long long)b0, l, (int)(p0 % B), m->fill[b0][l]);
	#pragma omp parallel for schedule(static) if ((size_t)n * m->n_layers * kw >= ((size_t)1 << 16))
	for (int l = 0; l < m->n_layers; l++)
		for (int j = 0; j < n; j++) {
			const int64_t p = p0 + j;
			const size_t row = ((size_t)l * n + j) * kw;

			for (int h = 0; h < H; h++) {
				char *pk = page(m, p / B, l, 0), *pv = page(m, p / B, l, 1);
				size_t at = ((size_t)h * B + p % B) * d, in = row + (size_t)h * d;

				if (dtype == KVMEM_DTYPE_BF16) {
					put_bf16(m, pk, at, (const uint16_t *)k + in, d);
					put_bf16(m, pv, at, (const uint16_t *)v + in, d);
				} else {
					put_f32(m, pk, at, (const float *)k + in, d);
					put_f32(m, pv, at, (const float *)v + in, d);
				}
			}
		}
	for (int64_t b = b0; b <= b1; b++) {
		int64_t end = p0 + n - b * B;

		for (int l = 0; l < m->n_layers; l++)
			m->fill[b][l] = end < B ? (int)end : B;
	}
	return 0;
}

static int mem_get(void *ctx, int64_t b, int layer, kvmem_page *pg)
{
	struct mem_source *m = ctx;

	if (b < 0 || (size_t)b >= m->cap || !m->blocks[b] || layer < 0 || layer >= m->n_layers)
		return kvmem_error(EINVAL, "page source: block %lld layer %d was never written",
				 (long long)b, layer);
	pg->k = page(m, b, layer, 0);
	pg->v = page(m, b, layer, 1);
	pg->dtype = m->dtype;
	pg->mem = KVMEM_MEM_HOST;
	return 0;
}

static void mem_put(void *ctx, int64_t b, int layer)
{
}

static void mem_destroy(void *ctx)
{
	struct mem_source *m = ctx;

	for (size_t b = 0; b < m->cap; b++) {
		free(m->blocks[b]);
		free(m->fill[b]);
	}
	free(m->blocks);
	free(m->fill);
	free(m);
}

static const kvmem_page_source_ops mem_ops = {
	.name = "mem",
	.write = mem_write,
	.get = mem_get,
	.put = mem_put,
	.destroy = mem_destroy,
	.write_rows = mem_write_rows,
};

int kvmem_page_source_mem_dtype(kvmem_page_source *src, int n_layers, int n_kv_heads,
				int head_dim, int block, uint32_t dtype)
{
	struct mem_source *m;

	if (dtype != KVMEM_DTYPE_F32 && dtype != KVMEM_DTYPE_BF16)
		return kvmem_error(EINVAL, "page source: pages of dtype %u (f32 or bf16 only)",
				   dtype);
	if (!(m = calloc(1, sizeof(*m))))
		return kvmem_error(ENOMEM, "page source: out of memory");
	m->dtype = dtype;
	m->n_layers = n_layers;
	m->n_kv_heads = n_kv_heads;
	m->head_dim = head_dim;
	m->block = block;
	m->page_bytes = (size_t)n_kv_heads * block * head_dim * kvmem_dtype_bytes(dtype);
	src->ops = &mem_ops;
	src->ctx = m;
	return 0;
}

int kvmem_page_source_mem(kvmem_page_source *src, int n_layers, int n_kv_heads, int head_dim,
			int block)
{
	return kvmem_page_source_mem_dtype(src, n_layers, n_kv_heads, head_dim, block,
					   KVMEM_DTYPE_F32);
}
