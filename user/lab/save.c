// SPDX-License-Identifier: MIT
/*
 * A page source's history written out as a workspace directory, so that a
 * session run over host memory (the recall bench) leaves what a replay
 * reads: token ids, every full block's pages, the partial block, one
 * commit. Public API only (the pager's).
 */
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "kvmem/lab.h"
#include "kvmem/store.h"
#include "kernels/kernels.h"
#include "kernels/kernels_fp8.h"

/* Page (b, l) of src, tokens 0..len-1, into dst in the geometry's dtype:
 * K [Hkv][B][D] then V. */
static int copy_page(const kvmem_page_source *src, const kvmem_page_geom *g, int64_t b, int l,
		     int len, void *dst, float *f32)
{
	const size_t H = g->n_kv_heads, B = g->block_tokens, D = g->head_dim, half = H * B * D;
	kvmem_page pg;
	int rc = 0;

	if ((rc = src->ops->get(src->ctx, b, l, &pg)))
		return kvmem_error_prefix("reading block %lld layer %d", (long long)b, l);
	memset(f32, 0, 2 * half * sizeof(float));
	for (int kv = 0; kv < 2 && !rc; kv++)
		for (size_t h = 0; h < H && !rc; h++)
			rc = kvmem_page_copy_f32(&pg, kv, h * B * D, (size_t)len * D,
						 f32 + kv * half + h * B * D);
	src->ops->put(src->ctx, b, l);
	if (rc)
		return kvmem_error_prefix("reading block %lld layer %d", (long long)b, l);
	if (g->dtype == KVMEM_DTYPE_FP8) {
		/* the page's rows (K, then V) quantised, their scales after them */
		for (size_t r = 0; r < 2 * H * B; r++)
			kvmem_fp8_quant_row((uint8_t *)dst + r * D, (float *)((char *)dst + 2 * half) + r,
					    f32 + r * D, (int)D);
		return 0;
	}
	for (size_t i = 0; i < 2 * half; i++) {
		if (g->dtype == KVMEM_DTYPE_F32)
			((float *)dst)[i] = f32[i];
		else if (g->dtype == KVMEM_DTYPE_BF16)
			((uint16_t *)dst)[i] = kvmem_f32_to_bf16(f32[i]);
		else
			((uint16_t *)dst)[i] = kvmem_f32_to_f16(f32[i]);
	}
	return 0;
}

int kvmem_lab_save_workspace(const char *dir, const kvmem_model *m, int block, uint32_t dtype,
			     const kvmem_page_source *src, const int32_t *ids, int64_t n)
{
	kvmem_page_geom g;
	kvmem_pager_opts po;
	kvmem_pager *p = NULL;
	void **pages = NULL;
	float *f32 = NULL;
	int64_t full;
	int rc, L;

	kvmem_page_geom_model(&g, m, block ? block : KVMEM_BLOCK_DEFAULT);
	if (dtype)
		g.dtype = dtype;
	if (!kvmem_dtype_bytes(g.dtype))
		return kvmem_error(EINVAL, "%s: page dtype %u", dir, g.dtype);
	kvmem_pager_opts_default(&po);
	po.flags = KVMEM_PAGER_CREATE;
	if ((rc = kvmem_pager_open(dir, &g, &po, &p)) < 0)
		return kvmem_error_prefix("lab: saving the workspace");
	if (kvmem_pager_tokens(p)) {
		kvmem_pager_close(p);
		return kvmem_error(EEXIST, "%s: holds a workspace already; the lab saves into a new one",
				   dir);
	}
	L = (int)g.n_layers;
	full = n / g.block_tokens;
	pages = calloc(L, sizeof(*pages));
	f32 = malloc(2 * (size_t)g.n_kv_heads * g.block_tokens * g.head_dim * sizeof(float));
	for (int l = 0; pages && l < L; l++)
		pages[l] = malloc(kvmem_page_bytes(&g));
	if (!pages || !f32 || !pages[L - 1]) {
		rc = kvmem_error(ENOMEM, "%s: out of memory", dir);
		goto out;
	}
	if ((rc = kvmem_pager_append_tokens(p, ids, (size_t)n)) < 0)
		goto out;
	for (int64_t b = 0; b <= full; b++) {
		int len = b < full ? (int)g.block_tokens : (int)(n - full * g.block_tokens);

		if (b == full && !len)
			break;
		for (int l = 0; l < L; l++)
			if ((rc = copy_page(src, &g, b, l, len, pages[l], f32)))
				goto out;
		if (b < full &&
		    (rc = kvmem_pager_append_block(p, (uint64_t)b, (const void *const *)pages, NULL)) < 0)
			goto out;
		if (b == full)
			break;
	}
	rc = kvmem_pager_commit(p, n % g.block_tokens ? (const void *const *)pages : NULL, NULL,
				NULL, 0);
out:
	for (int l = 0; pages && l < L; l++)
		free(pages[l]);
	free(pages);
	free(f32);
	{
		int c = kvmem_pager_close(p);

		if (!rc && c < 0)
			rc = c;
	}
	return rc < 0 ? kvmem_error_prefix("lab: saving the workspace %s", dir) : 0;
}
