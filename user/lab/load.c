// SPDX-License-Identifier: MIT
/*
 * What a replay needs from a workspace directory: its token ids and every
 * token's raw K, read once through the pager (read-only: a workspace a
 * writer holds is not disturbed) into [L][N][Hkv][D] fp32, from which the
 * index and K pages of any block size are cut. V is never read: no policy
 * scores values, and the view a replay plans is never built.
 *
 * Also the K page source over it (re-blocked: a page of any block size is
 * assembled on get from the token rows and freed on put).
 */
#include <stdlib.h>
#include <string.h>

#include "kvmem/kvmem.h"
#include "kvmem/store.h"
#include "lab/lab_int.h"

struct load_arg {
	kvmem_lab *lab;
	uint32_t B, dtype;
	float *scratch;
};

/* Page `id` (block id / L, layer id % L) of full blocks: its K into the rows. */
static void scatter(kvmem_lab *lab, int64_t b, int l, int B, int len, const float *k)
{
	const int H = lab->Hkv, D = lab->D;

	for (int t = 0; t < len; t++)
		for (int h = 0; h < H; h++)
			memcpy(lab->k + (((size_t)l * lab->n_tokens + (size_t)b * B + t) * H + h) * D,
			       k + ((size_t)h * B + t) * D, (size_t)D * sizeof(float));
}

static int load_page(void *arg, uint64_t id, const void *data)
{
	struct load_arg *a = arg;
	kvmem_lab *lab = a->lab;
	kvmem_page pg;
	const float *k;

	kvmem_page_at(&pg, data, a->dtype, lab->Hkv, (int)a->B, lab->D);	/* fp8: its scales */
	if (!(k = kvmem_page_f32(&pg, 0, (size_t)lab->Hkv * a->B * lab->D, a->scratch)))
		return kvmem_fail();
	scatter(lab, (int64_t)(id / lab->L), (int)(id % lab->L), (int)a->B, (int)a->B, k);
	return 0;
}

int lab_load(kvmem_lab *lab, const char *dir)
{
	kvmem_pager_opts po;
	kvmem_pager *p = NULL;
	const kvmem_page_geom *g;
	struct load_arg a = { .lab = lab };
	uint64_t *pages = NULL, full, n_pages;
	void **tail = NULL;
	int rc;

	kvmem_pager_opts_default(&po);
	po.flags = KVMEM_PAGER_RDONLY;
	if ((rc = kvmem_pager_open(dir, NULL, &po, &p)) < 0)
		return rc;
	g = kvmem_pager_geom(p);
	lab->L = (int)g->n_layers;
	lab->Hq = (int)g->n_heads;
	lab->Hkv = (int)g->n_kv_heads;
	lab->D = (int)g->head_dim;
	lab->n_tokens = (int64_t)kvmem_pager_committed_tokens(p);
	a.B = g->block_tokens;
	a.dtype = g->dtype;
	full = (uint64_t)lab->n_tokens / a.B;
	n_pages = full * lab->L;
	lab->ids = malloc((size_t)(lab->n_tokens ? lab->n_tokens : 1) * sizeof(int32_t));
	lab->k = malloc((size_t)lab->L * (lab->n_tokens ? lab->n_tokens : 1) * lab->Hkv * lab->D *
			sizeof(float));
	a.scratch = malloc((size_t)lab->Hkv * a.B * lab->D * sizeof(float));
	pages = malloc((n_pages ? n_pages : 1) * sizeof(*pages));
	if (!lab->ids || !lab->k || !a.scratch || !pages) {
		rc = kvmem_error(ENOMEM, "%s: out of memory for %lld tokens' raw K (%.0f MB)", dir,
				 (long long)lab->n_tokens,
				 (double)lab->L * lab->n_tokens * lab->Hkv * lab->D * 4 / 1e6);
		goto out;
	}
	if (lab->n_tokens && (rc = kvmem_pager_read_tokens(p, 0, (size_t)lab->n_tokens, lab->ids)) < 0)
		goto out;
	for (uint64_t i = 0; i < n_pages; i++)
		pages[i] = i;
	if (n_pages && kvmem_pager_stage_in(p, pages, n_pages, load_page, &a) < 0) {
		rc = kvmem_fail();
		goto out;
	}
	if ((uint64_t)lab->n_tokens > full * a.B) {
		size_t pb = kvmem_page_bytes(g);
		int len = (int)(lab->n_tokens - (int64_t)full * a.B);

		tail = calloc(lab->L, sizeof(*tail));
		for (int l = 0; tail && l < lab->L; l++)
			if (!(tail[l] = malloc(pb)))
				break;
		if (!tail || !tail[lab->L - 1]) {
			rc = kvmem_error(ENOMEM, "%s: out of memory", dir);
			goto out;
		}
		if ((rc = kvmem_pager_read_tail(p, tail, NULL)) < 0)
			goto out;
		for (int l = 0; l < lab->L; l++) {
			kvmem_page pg;
			const float *k;

			kvmem_page_at(&pg, tail[l], a.dtype, lab->Hkv, (int)a.B, lab->D);
			if (!(k = kvmem_page_f32(&pg, 0, (size_t)lab->Hkv * a.B * lab->D, a.scratch))) {
				rc = kvmem_fail();
				goto out;
			}
			scatter(lab, (int64_t)full, l, (int)a.B, len, k);
		}
	}
	rc = 0;
out:
	for (int l = 0; tail && l < lab->L; l++)
		free(tail[l]);
	free(tail);
	free(pages);
	free(a.scratch);
	{
		int c = kvmem_pager_close(p);

		if (!rc && c < 0)
			rc = c;
	}
	if (rc < 0)
		return kvmem_error_prefix("lab: reading the workspace %s", dir);
	return 0;
}

/* ---- the K page source --------------------------------------------------- */
static int ks_write(void *ctx, int64_t b, int l, int t0, int n, const float *k, const float *v)
{
	(void)ctx, (void)b, (void)l, (void)t0, (void)n, (void)k, (void)v;
	return kvmem_error(EINVAL, "lab: a replay's page source is read-only");
}

static int ks_get(void *ctx, int64_t b, int l, kvmem_page *pg)
{
	struct lab_ksrc *ks = ctx;
	const kvmem_lab *lab = ks->lab;
	const int B = ks->block, H = lab->Hkv, D = lab->D;
	int64_t p0 = b * B;
	int len = p0 + B <= lab->n_tokens ? B : (int)(lab->n_tokens - p0);
	float *page;

	if (b < 0 || l < 0 || l >= lab->L || len <= 0)
		return kvmem_error(EINVAL, "lab: no page for block %lld layer %d", (long long)b, l);
	if (ks->n_reads == ks->cap_reads) {
		size_t c = ks->cap_reads ? 2 * ks->cap_reads : 1024;
		struct lab_read *r = realloc(ks->reads, c * sizeof(*r));

		if (!r)
			return kvmem_error(ENOMEM, "lab: out of memory");
		ks->reads = r;
		ks->cap_reads = c;
	}
	if (ks->n_held == ks->cap_held) {
		size_t c = ks->cap_held ? 2 * ks->cap_held : 16;
		struct lab_held *h = realloc(ks->held, c * sizeof(*h));

		if (!h)
			return kvmem_error(ENOMEM, "lab: out of memory");
		ks->held = h;
		ks->cap_held = c;
	}
	/* K then V (zeros): V is not kept. */
	if (!(page = calloc(2 * (size_t)H * B * D, sizeof(float))))
		return kvmem_error(ENOMEM, "lab: out of memory");
	for (int h = 0; h < H; h++)
		for (int t = 0; t < len; t++)
			memcpy(page + ((size_t)h * B + t) * D,
			       lab->k + (((size_t)l * lab->n_tokens + p0 + t) * H + h) * D,
			       (size_t)D * sizeof(float));
	ks->reads[ks->n_reads++] = (struct lab_read){ b, l };
	ks->held[ks->n_held++] = (struct lab_held){ b, l, page };
	pg->k = page;
	pg->v = page + (size_t)H * B * D;
	pg->dtype = KVMEM_DTYPE_F32;
	pg->mem = KVMEM_MEM_HOST;
	return 0;
}

/* put names (block, layer) only: the latest page got for it goes. */
static void ks_put(void *ctx, int64_t b, int l)
{
	struct lab_ksrc *ks = ctx;

	for (size_t i = ks->n_held; i-- > 0;)
		if (ks->held[i].block == b && ks->held[i].layer == l) {
			free(ks->held[i].page);
			ks->held[i] = ks->held[--ks->n_held];
			return;
		}
}

static const kvmem_page_source_ops ks_ops = {
	.name = "lab", .write = ks_write, .get = ks_get, .put = ks_put,
};

void lab_ksrc_init(struct lab_ksrc *ks, kvmem_page_source *src, const kvmem_lab *lab, int block)
{
	memset(ks, 0, sizeof(*ks));
	ks->lab = lab;
	ks->block = block;
	src->ops = &ks_ops;
	src->ctx = ks;
}

void lab_ksrc_free(struct lab_ksrc *ks)
{
	for (size_t i = 0; i < ks->n_held; i++)
		free(ks->held[i].page);
	free(ks->held);
	ks->held = NULL;
	ks->n_held = ks->cap_held = 0;
	free(ks->reads);
	ks->reads = NULL;
	ks->n_reads = ks->cap_reads = 0;
}
