// SPDX-License-Identifier: MIT
/* Reading a page's K or V as fp32, whatever dtype its source keeps. */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_fp8.h"
#include "kvmem/kvmem.h"
#include "kvmem/source.h"

/* The 256 e4m3 values, decoded once: kvmem_e4m3_to_f32 costs an ldexpf a
 * byte, which made placing fp8 pages on the cpu backend slower than bf16
 * (benchmarks.md, "Cold page-in, fp8 against bf16"). Same values, so the
 * same bits. */
static float e4m3_values[256];
static pthread_once_t e4m3_once = PTHREAD_ONCE_INIT;

static void e4m3_decode_all(void)
{
	for (int b = 0; b < 256; b++)
		e4m3_values[b] = kvmem_e4m3_to_f32((uint8_t)b);
}

/* Elements off..off+n-1 of an fp8 page's K (or V), dequantised (exact):
 * a row's bytes times the row's scale, a row at a time. */
static int fp8_copy(const kvmem_page *pg, int is_v, size_t off, size_t n, float *dst)
{
	const uint8_t *q = (const uint8_t *)(is_v ? pg->v : pg->k);
	const float *sc = is_v ? pg->v_scale : pg->k_scale;
	const size_t run = pg->scale_run, end = off + n;

	if (!sc || !run)
		return kvmem_error(EINVAL, "page source: an fp8 page without its scales");
	pthread_once(&e4m3_once, e4m3_decode_all);
	for (size_t i = off; i < end;) {
		const size_t row_end = (i / run + 1) * run, e = row_end < end ? row_end : end;
		const float s = sc[i / run];

		for (; i < e; i++)
			dst[i - off] = e4m3_values[q[i]] * s;
	}
	return 0;
}

void kvmem_page_at(kvmem_page *pg, const void *base, uint32_t dtype, int n_kv_heads, int block,
		   int head_dim)
{
	const size_t rows = (size_t)n_kv_heads * block, half = rows * head_dim *
							     kvmem_dtype_bytes(dtype);

	pg->k = base;
	pg->v = (const char *)base + half;
	pg->dtype = dtype;
	pg->mem = KVMEM_MEM_HOST;
	pg->k_scale = pg->v_scale = NULL;
	pg->scale_run = 0;
	if (dtype == KVMEM_DTYPE_FP8) {
		pg->k_scale = (const float *)((const char *)base + 2 * half);
		pg->v_scale = pg->k_scale + rows;
		pg->scale_run = (uint32_t)head_dim;
	}
}

const float *kvmem_page_f32(const kvmem_page *pg, int is_v, size_t n, float *scratch)
{
	const void *p = is_v ? pg->v : pg->k;

	if (pg->mem != KVMEM_MEM_HOST) {
		kvmem_error(ENOTSUP, "page source: the page is in device memory, not readable here");
		return NULL;
	}
	switch (pg->dtype) {
	case KVMEM_DTYPE_F32:
		return p;
	case KVMEM_DTYPE_BF16:
		kvmem_bf16_to_f32_n(scratch, p, n);
		return scratch;
	case KVMEM_DTYPE_F16:
		kvmem_f16_to_f32_n(scratch, p, n);
		return scratch;
	case KVMEM_DTYPE_FP8:
		return fp8_copy(pg, is_v, 0, n, scratch) ? NULL : scratch;
	}
	kvmem_error(EINVAL, "page source: unknown page dtype %u", pg->dtype);
	return NULL;
}

int kvmem_page_copy_f32(const kvmem_page *pg, int is_v, size_t off, size_t n, float *dst)
{
	const char *p = is_v ? pg->v : pg->k;

	if (pg->mem != KVMEM_MEM_HOST)
		return kvmem_error(ENOTSUP, "page source: the page is in device memory, not readable here");
	switch (pg->dtype) {
	case KVMEM_DTYPE_F32:
		memcpy(dst, (const float *)p + off, n * sizeof(float));
		return 0;
	case KVMEM_DTYPE_BF16:
		kvmem_bf16_to_f32_n(dst, (const uint16_t *)p + off, n);
		return 0;
	case KVMEM_DTYPE_F16:
		kvmem_f16_to_f32_n(dst, (const uint16_t *)p + off, n);
		return 0;
	case KVMEM_DTYPE_FP8:
		return fp8_copy(pg, is_v, off, n, dst);
	}
	return kvmem_error(EINVAL, "page source: unknown page dtype %u", pg->dtype);
}

void kvmem_page_source_destroy(kvmem_page_source *src)
{
	if (src && src->ops && src->ops->destroy)
		src->ops->destroy(src->ctx);
	if (src) {
		src->ops = NULL;
		src->ctx = NULL;
	}
}

int kvmem_page_source_commit(kvmem_page_source *src, const int32_t *ids, int64_t n,
			     const void *app, uint32_t app_len)
{
	if (!src->ops->commit)
		return kvmem_error(ENOTSUP, "page source %s keeps nothing to commit", src->ops->name);
	return src->ops->commit(src->ctx, ids, n, app, app_len);
}
