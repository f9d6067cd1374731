// SPDX-License-Identifier: MIT
/*
 * The workspace layer's page source backed by the tiered pager. The session
 * writes each new token's raw K / V per layer; blocks still filling up stay
 * in memory here (several can be open: a chunk spans blocks and arrives layer
 * by layer), and each block is staged out the moment all its layers are
 * full, in block order. Reads of full blocks are pager fetches, pinned until
 * put; reads of open blocks are served from memory.
 *
 * An open block's pages are made where they will stay: in host pool slots
 * the pager gives for it (kvmem_pager_block_memory), so the rows are copied
 * once, into their page layout, and the pager writes them to disk from
 * there and keeps them in the pool (before, they went on to a stage-out
 * extent and the pool in two more copies). Where the pool has no room, or
 * the pager keeps nothing (NO_KEEP), the block is memory of this source's
 * own as before, and the pager copies it.
 *
 * Pages are kept in the workspace's dtype: f32 (what the CPU engine
 * writes), or bf16 / f16 (a GPU's: the rows a forward pass returns as fp32
 * are rounded once here, on the way in, so nothing is converted on the way
 * out to the GPU), or fp8 (e4m3 with a scale per token and KV head: each
 * row quantised once, here, from the forward pass's rows; the index was
 * built from those rows before). The host pool is the source's region: a
 * backend pins it once and reads pages where the pager put them.
 *
 * A bf16 workspace's open blocks in pool slots can be written by the
 * backend itself (row_pages: a GPU copies a forward pass's rows, laid out
 * as pages on the device, straight into the pinned slots; write_rows with
 * no rows then only counts them in). row_pages runs on the session's
 * thread while the writer thread may be in write_rows for the forward
 * before: mu guards the open blocks between the two, and a full block is
 * taken off them under it but appended (its checksums read, its writes
 * queued) after it is let go, so the next forward's row_pages does not wait
 * for that.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_fp8.h"
#include "kvmem/kvmem.h"
#include "kvmem/pager.h"
#include "kvmem/source.h"
#include "kvmem/store.h"
#include "util/grow.h"

#define SPARE_MAX 64

struct psrc {
	kvmem_pager *p;
	const char *dir;		/* the workspace, for messages */
	const kvmem_page_geom *g;
	int L, H, D, B;
	size_t pf;		/* elements in one K (or V) page: H * B * D */
	size_t es;		/* bytes of one element in the workspace's dtype */
	size_t pb;		/* bytes of one page (fp8: with its scales) */
	int64_t first;		/* first open block: every block before it is staged out */
	int n_open;
	size_t cap_open;
	/* [n_open]: an open block's L pages ([2][H][B][D] in the dtype each),
	 * in pool slots or in memory of its own ([L][2][H][B][D]: own); the
	 * tokens written per layer. */
	struct oblk {
		char **layer;
		char *own;
		int *fill;
	} *ob;
	/* Buffers of blocks staged out, kept for the next open blocks: a
	 * prefill chunk opens 32 blocks of 4.7 MB at Qwen3-8B, and fresh
	 * memory for each (zeroed, faulted in page by page) cost more than
	 * the copies into it. */
	char *spare[SPARE_MAX];
	int n_spare;
	pthread_mutex_t mu;	/* the above, between row_pages and write_rows */
};

static void oblk_free(struct psrc *s, struct oblk *o)
{
	if (o->own) {
		if (s->n_spare < SPARE_MAX)
			s->spare[s->n_spare++] = o->own;
		else
			free(o->own);
	}
	free(o->layer);
	free(o->fill);
	memset(o, 0, sizeof(*o));
}

/* Open block b (b >= first), made on demand: its layers' pages and fill. */
static int open_block(struct psrc *s, int64_t b, char ***layer, int **fill)
{
	int64_t i = b - s->first;
	struct oblk *o;

	if (i < 0)
		return kvmem_error(EINVAL, "%s: block %" PRId64 " is already staged out and cannot change",
				 s->dir, b);
	if (i >= (int64_t)s->cap_open) {
		size_t c = s->cap_open;

		/* New entries zeroed. */
		if (kvmem_grow(&s->ob, sizeof(*s->ob), (size_t)i + 1, &c, 4))
			return kvmem_error(ENOMEM, "%s: out of memory", s->dir);
		memset(s->ob + s->cap_open, 0, (c - s->cap_open) * sizeof(*s->ob));
		s->cap_open = c;
	}
	o = &s->ob[i];
	if (!o->layer) {
		o->layer = malloc((size_t)s->L * sizeof(*o->layer));
		o->fill = calloc(s->L, sizeof(int));
		if (!o->layer || !o->fill) {
			oblk_free(s, o);
			return kvmem_error(ENOMEM, "%s: out of memory for block %" PRId64, s->dir, b);
		}
		if (kvmem_pager_block_memory(s->p, (uint64_t)b, (void **)o->layer) < 0) {
			/* A spare holds an older block's bytes past what is
			 * written: unspecified, as a page's tokens past its
			 * length are. */
			o->own = s->n_spare ? s->spare[--s->n_spare] :
					      malloc((size_t)s->L * s->pb);
			if (!o->own) {
				oblk_free(s, o);
				return kvmem_error(ENOMEM, "%s: out of memory for block %" PRId64, s->dir, b);
			}
			for (int l = 0; l < s->L; l++)
				o->layer[l] = o->own + (size_t)l * s->pb;
		}
	}
	if (i >= s->n_open)
		s->n_open = i + 1;
	*layer = o->layer;
	*fill = o->fill;
	return 0;
}

/* Take the leading open blocks whose layers are all full off the open
 * ones (into *out, at most max; the first is block *b0): under mu. */
static int take_full(struct psrc *s, struct oblk *out, int max, int64_t *b0)
{
	int n = 0;

	*b0 = s->first;
	while (n < max && s->n_open && s->ob[0].layer) {
		struct oblk *o = &s->ob[0];

		for (int l = 0; l < s->L; l++)
			if (o->fill[l] < s->B)
				return n;
		out[n++] = *o;
		memmove(s->ob, s->ob + 1, (s->cap_open - 1) * sizeof(*s->ob));
		memset(&s->ob[s->cap_open - 1], 0, sizeof(*s->ob));
		s->n_open--;
		s->first++;
	}
	return n;
}

/* Stage out the n blocks take_full took, in order, then free them (the
 * spares under mu). A failure leaves the rest unstaged: the session is
 * broken then (its history lacks them). */
static int stage_taken(struct psrc *s, struct oblk *t, int n, int64_t b0, int locked)
{
	int rc = 0;

	for (int i = 0; i < n; i++)
		if (!rc && kvmem_pager_append_block(s->p, b0 + i, (const void *const *)t[i].layer,
						    NULL) < 0)
			rc = kvmem_fail();
	if (!locked)
		pthread_mutex_lock(&s->mu);
	for (int i = 0; i < n; i++)
		oblk_free(s, &t[i]);
	if (!locked)
		pthread_mutex_unlock(&s->mu);
	return rc;
}

/* Stage out every leading open block whose layers are all full (one
 * thread: the per-layer write path). */
static int flush_full(struct psrc *s)
{
	struct oblk t[16];
	int64_t b0;
	int n;

	while ((n = take_full(s, t, 16, &b0)) > 0)
		if (stage_taken(s, t, n, b0, 1) < 0)
			return kvmem_fail();
	return 0;
}

/* n fp32 values into the workspace's dtype. */
static void put_row(const struct psrc *s, char *dst, const float *src, int n)
{
	switch (s->g->dtype) {
	case KVMEM_DTYPE_BF16:
		kvmem_f32_to_bf16_n((uint16_t *)dst, src, (size_t)n);
		break;
	case KVMEM_DTYPE_F16:
		for (int i = 0; i < n; i++)
			((uint16_t *)dst)[i] = kvmem_f32_to_f16(src[i]);
		break;
	default:
		memcpy(dst, src, (size_t)n * sizeof(float));
	}
}

/* n values of dtype `from` (f32 or bf16) into the workspace's dtype. */
static void put_typed(const struct psrc *s, char *dst, const void *src, uint32_t from, int n)
{
	if (from == KVMEM_DTYPE_F32) {
		put_row(s, dst, src, n);
		return;
	}
	switch (s->g->dtype) {
	case KVMEM_DTYPE_BF16:	/* a GPU's rows into a GPU's workspace: as they are */
		memcpy(dst, src, (size_t)n * 2);
		break;
	case KVMEM_DTYPE_F16:
		for (int i = 0; i < n; i++)
			((uint16_t *)dst)[i] =
				kvmem_f32_to_f16(kvmem_bf16_to_f32(((const uint16_t *)src)[i]));
		break;
	default:
		kvmem_bf16_to_f32_n((float *)dst, src, (size_t)n);
	}
}

/* Row (h, t) of K (or V) of the page at pg from n values of dtype `from`:
 * fp8 quantises it (kernels/kernels_fp8.h) and stores its scale. */
static void put_at(const struct psrc *s, char *pg, int is_v, int h, int t, const void *src,
		   uint32_t from)
{
	const size_t row = (size_t)h * s->B + t;
	char *dst = pg + (is_v ? s->pf * s->es : 0) + row * s->D * s->es;
	float wide[1024];	/* head_dim <= 1024 (config.json's bound) */
	float *scale;

	if (s->g->dtype != KVMEM_DTYPE_FP8) {
		put_typed(s, dst, src, from, s->D);
		return;
	}
	if (from == KVMEM_DTYPE_BF16) {
		kvmem_bf16_to_f32_n(wide, src, (size_t)s->D);
		src = wide;
	}
	scale = (float *)(pg + 2 * s->pf) + (is_v ? (size_t)s->H * s->B : 0) + row;
	kvmem_fp8_quant_row((uint8_t *)dst, scale, src, s->D);
}

/* A backend writes rows into pages of these dtypes itself (row_pages). */
static int placed_dtype(uint32_t dtype)
{
	return dtype == KVMEM_DTYPE_BF16 || dtype == KVMEM_DTYPE_FP8;
}

/*
 * A forward pass's rows whole: every layer's tokens p0..p0+n-1. The open
 * blocks are made first (on this thread), then the layers are copied on
 * the OpenMP threads (each layer's rows and page bytes are its own; a
 * 1024-token chunk at Qwen3-8B is 151 MB of bf16), then full blocks are
 * staged out in order. No rows (k and v NULL): a backend wrote them into
 * the pages row_pages gave (bf16 or fp8), and they are only counted in.
 */
static int ps_write_rows(void *ctx, int64_t p0, int n, const void *k, const void *v,
			 uint32_t dtype)
{
	struct psrc *s = ctx;
	const size_t kw = (size_t)s->H * s->D, es_in = dtype == KVMEM_DTYPE_F32 ? 4 : 2;
	const int placed = !k && !v;
	int64_t b0, nb;
	char ***pages = NULL;
	int **fill = NULL, rc = -1;

	if (dtype != KVMEM_DTYPE_F32 && dtype != KVMEM_DTYPE_BF16)
		return kvmem_error(ENOTSUP, "%s: rows of dtype %u (f32 or bf16 only)", s->dir, dtype);
	if (p0 < 0 || n < 0 || (!k != !v) ||
	    (placed && (dtype != KVMEM_DTYPE_BF16 || !placed_dtype(s->g->dtype))))
		return kvmem_error(EINVAL, "%s: bad rows write: tokens %" PRId64 "+%d%s", s->dir, p0, n,
				   placed ? ", rows already in bf16 pages" : "");
	if (!n)
		return 0;
	b0 = p0 / s->B;
	nb = (p0 + n - 1) / s->B - b0 + 1;
	pages = malloc((size_t)nb * sizeof(*pages));
	fill = malloc((size_t)nb * sizeof(*fill));
	if (!pages || !fill) {
		kvmem_error(ENOMEM, "%s: out of memory", s->dir);
		goto out;
	}
	/* The blocks' pages and fill counts stay where they are until this
	 * thread stages them out: the copy needs no lock. */
	pthread_mutex_lock(&s->mu);
	for (int64_t i = 0; i < nb; i++) {
		if (open_block(s, b0 + i, &pages[i], &fill[i]) < 0) {
			pthread_mutex_unlock(&s->mu);
			goto out;
		}
		for (int l = 0; l < s->L; l++) {
			int t0 = i ? 0 : (int)(p0 % s->B);

			if (fill[i][l] != t0) {
				pthread_mutex_unlock(&s->mu);
				kvmem_error(EINVAL, "%s: block %" PRId64 " layer %d written at token %d, "
					    "%d are there: tokens must come in order", s->dir, b0 + i,
					    l, t0, fill[i][l]);
				goto out;
			}
		}
	}
	pthread_mutex_unlock(&s->mu);
	#pragma omp parallel for schedule(static) if (!placed && (size_t)n * s->L * kw >= ((size_t)1 << 16))
	for (int l = 0; l < (placed ? 0 : s->L); l++)
		for (int j = 0; j < n; j++) {
			const int64_t p = p0 + j;
			const int t = (int)(p % s->B);
			char *blk = pages[p / s->B - b0][l];
			const size_t row = ((size_t)l * n + j) * kw;

			for (int h = 0; h < s->H; h++) {
				put_at(s, blk, 0, h, t, (const char *)k + (row + (size_t)h * s->D) * es_in,
				       dtype);
				put_at(s, blk, 1, h, t, (const char *)v + (row + (size_t)h * s->D) * es_in,
				       dtype);
			}
		}
	rc = 0;
	for (;;) {
		struct oblk t[64];
		int64_t first;
		int m;

		pthread_mutex_lock(&s->mu);
		for (int64_t i = 0; i < nb && fill; i++) {
			int64_t end = p0 + n - (b0 + i) * s->B;

			for (int l = 0; l < s->L; l++)
				fill[i][l] = end < s->B ? (int)end : s->B;
		}
		free(fill);	/* the counts are in; the blocks may go now */
		fill = NULL;
		m = take_full(s, t, 64, &first);
		pthread_mutex_unlock(&s->mu);
		if (!m)
			break;
		if (stage_taken(s, t, m, first, 0) < 0) {
			rc = -1;
			break;
		}
	}
out:
	free(pages);
	free(fill);
	return rc < 0 ? kvmem_fail() : 0;
}

/* The pages tokens p0..p0+n-1 go into, for the backend to write them:
 * pages[l * nb + i], nb blocks from p0's. Only a bf16 or fp8 workspace's
 * blocks in pool slots (pinned with the pool: a backend's copies go there
 * directly); -ENOTSUP otherwise, when the rows must come as rows. */
static int ps_row_pages(void *ctx, int64_t p0, int n, void **pages)
{
	struct psrc *s = ctx;
	const int64_t b0 = p0 / s->B, nb = n > 0 ? (p0 % s->B + n - 1) / s->B + 1 : 0;
	int rc = 0;

	if (!placed_dtype(s->g->dtype))
		return kvmem_error(ENOTSUP, "%s: pages of dtype %u are made from rows", s->dir,
				   s->g->dtype);
	if (p0 < 0 || n <= 0)
		return kvmem_error(EINVAL, "%s: bad pages request: tokens %" PRId64 "+%d", s->dir, p0,
				   n);
	pthread_mutex_lock(&s->mu);
	for (int64_t i = 0; i < nb && !rc; i++) {
		char **layer;
		int *fill;

		if (open_block(s, b0 + i, &layer, &fill) < 0)
			rc = kvmem_fail();
		else if (s->ob[b0 + i - s->first].own)
			rc = kvmem_error(ENOTSUP, "%s: block %" PRId64 " is made outside the host pool",
					 s->dir, b0 + i);
		else
			for (int l = 0; l < s->L; l++)
				pages[(size_t)l * nb + i] = layer[l];
	}
	pthread_mutex_unlock(&s->mu);
	return rc;
}

static uint32_t ps_page_dtype(void *ctx)
{
	return ((struct psrc *)ctx)->g->dtype;
}

static int ps_write(void *ctx, int64_t b, int layer, int t0, int n, const float *k,
		    const float *v)
{
	struct psrc *s = ctx;
	char **pages;
	int *fill;

	if (layer < 0 || layer >= s->L || t0 < 0 || n < 0 || t0 + n > s->B)
		return kvmem_error(EINVAL, "%s: bad page write: block %" PRId64 " layer %d tokens %d+%d",
				 s->dir, b, layer, t0, n);
	if (open_block(s, b, &pages, &fill) < 0)
		return kvmem_fail();
	if (t0 != fill[layer])
		return kvmem_error(EINVAL, "%s: block %" PRId64 " layer %d written at token %d, %d are there: "
				 "tokens must come in order", s->dir, b, layer, t0, fill[layer]);
	for (int h = 0; h < s->H; h++)
		for (int j = 0; j < n; j++) {
			put_at(s, pages[layer], 0, h, t0 + j, k + ((size_t)j * s->H + h) * s->D,
			       KVMEM_DTYPE_F32);
			put_at(s, pages[layer], 1, h, t0 + j, v + ((size_t)j * s->H + h) * s->D,
			       KVMEM_DTYPE_F32);
		}
	fill[layer] = t0 + n;
	return flush_full(s);
}

static int ps_get(void *ctx, int64_t b, int layer, kvmem_page *pg)
{
	struct psrc *s = ctx;
	const void *data;
	uint64_t id;

	if (layer < 0 || layer >= s->L || b < 0)
		return kvmem_error(EINVAL, "%s: bad page read: block %" PRId64 " layer %d", s->dir, b,
				 layer);
	if (b >= s->first) {
		if (b - s->first >= s->n_open || !s->ob[b - s->first].layer)
			return kvmem_error(EINVAL, "%s: block %" PRId64 " layer %d was never written", s->dir,
					 b, layer);
		kvmem_page_at(pg, s->ob[b - s->first].layer[layer], s->g->dtype, s->H, s->B, s->D);
		return 0;
	}
	id = kvmem_page_id(s->g, b, layer);
	if (kvmem_pager_fetch(s->p, &id, 1, &data) < 0)
		return kvmem_fail();
	kvmem_page_at(pg, data, s->g->dtype, s->H, s->B, s->D);
	return 0;
}

static void ps_put(void *ctx, int64_t b, int layer)
{
	struct psrc *s = ctx;
	uint64_t pg;

	if (b < 0 || b >= s->first)
		return;
	pg = kvmem_page_id(s->g, b, layer);
	kvmem_pager_release(s->p, &pg, 1);
}

static int ps_resident(void *ctx, int64_t b, int layer)
{
	struct psrc *s = ctx;
	const struct kvmem_pte *e;

	/* Open blocks (b >= first) still fill: not pages to keep. */
	if (b < 0 || b >= s->first || layer < 0 || layer >= s->L)
		return 0;
	e = kvmem_pager_pte(s->p, kvmem_page_id(s->g, b, layer));
	return e && (e->tiers & KVMEM_TIER_HOST) && !(e->flags & KVMEM_PTE_IN_FLIGHT);
}

static void ps_prefetch(void *ctx, const int64_t *blocks, int n)
{
	struct psrc *s = ctx;
	uint64_t *pages = malloc((size_t)(n ? n : 1) * s->L * sizeof(*pages));
	size_t m = 0;

	if (!pages)
		return;	/* only a hint */
	for (int i = 0; i < n; i++)
		if (blocks[i] >= 0 && blocks[i] < s->first)
			for (int l = 0; l < s->L; l++)
				pages[m++] = kvmem_page_id(s->g, blocks[i], l);
	kvmem_pager_prefetch(s->p, pages, m);
	free(pages);
}

static void ps_hint(void *ctx, const int64_t *blocks, const float *scores, int n)
{
	struct psrc *s = ctx;

	for (int i = 0; i < n; i++)
		if (blocks[i] >= 0 && blocks[i] < s->first)
			kvmem_pager_hint(s->p, (uint64_t)blocks[i], scores[i]);
}

static int ps_region(void *ctx, void **base, size_t *len)
{
	struct psrc *s = ctx;

	kvmem_pager_region(s->p, base, len);
	return *base ? 0 : -ENOENT;
}

static void ps_destroy(void *ctx)
{
	struct psrc *s = ctx;

	/* Pool slots of open blocks are the pager's: its close gives them
	 * back. */
	for (size_t i = 0; i < s->cap_open; i++)
		oblk_free(s, &s->ob[i]);
	for (int i = 0; i < s->n_spare; i++)
		free(s->spare[i]);
	free(s->ob);
	pthread_mutex_destroy(&s->mu);
	free(s);
}

static int ps_commit(void *ctx, const int32_t *ids, int64_t n, const void *app, uint32_t app_len);

static const kvmem_page_source_ops pager_source_ops = {
	.name = "pager",
	.write = ps_write,
	.get = ps_get,
	.put = ps_put,
	.prefetch = ps_prefetch,
	.hint = ps_hint,
	.destroy = ps_destroy,
	.region = ps_region,
	.commit = ps_commit,
	.write_rows = ps_write_rows,
	.row_pages = ps_row_pages,
	.page_dtype = ps_page_dtype,
	.resident = ps_resident,
};

int kvmem_page_source_pager(kvmem_page_source *src, kvmem_pager *p)
{
	const kvmem_page_geom *g = kvmem_pager_geom(p);
	const char *dir = kvmem_pager_dir(p);
	struct psrc *s;
	int tail;

	if (g->dtype != KVMEM_DTYPE_F32 && g->dtype != KVMEM_DTYPE_BF16 &&
	    g->dtype != KVMEM_DTYPE_F16 && g->dtype != KVMEM_DTYPE_FP8)
		return kvmem_error(EINVAL, "%s: the session's page source takes f32, bf16, f16 or fp8 "
				 "pages, the workspace has dtype %u", dir, g->dtype);
	if (g->n_layers > 4096)
		return kvmem_error(EINVAL, "%s: too many layers (%u)", dir, g->n_layers);
	s = calloc(1, sizeof(*s));
	if (!s)
		return kvmem_error(ENOMEM, "%s: out of memory", dir);
	if (pthread_mutex_init(&s->mu, NULL)) {
		free(s);
		return kvmem_error(ENOMEM, "%s: cannot make a lock", dir);
	}
	s->p = p;
	s->dir = dir;
	s->g = g;
	s->L = g->n_layers;
	s->H = g->n_kv_heads;
	s->D = g->head_dim;
	s->B = g->block_tokens;
	s->pf = (size_t)s->H * s->B * s->D;
	s->es = kvmem_dtype_bytes(g->dtype);
	s->pb = kvmem_page_bytes(g);
	s->first = kvmem_pager_blocks(p);
	tail = (int)(kvmem_pager_tokens(p) % s->B);
	if (tail) {
		char **pages;
		int *fill;

		if (open_block(s, s->first, &pages, &fill) < 0) {
			ps_destroy(s);
			return kvmem_fail();
		}
		for (int l = 0; l < s->L; l++)
			fill[l] = tail;
		if (kvmem_pager_read_tail(p, (void *const *)pages, NULL) != tail) {
			ps_destroy(s);
			return kvmem_error_prefix("%s: restoring the partial block", dir);
		}
	}
	src->ops = &pager_source_ops;
	src->ctx = s;
	return 0;
}

/* Token ids past the pager's count are appended, then the full blocks, the
 * partial block and app are committed together. */
static int ps_commit(void *ctx, const int32_t *ids, int64_t n, const void *app, uint32_t app_len)
{
	struct psrc *s = ctx;
	const void *layers[4096];
	uint64_t have;
	int64_t tb;

	have = kvmem_pager_tokens(s->p);
	tb = n / s->B;
	if (n < (int64_t)have)
		return kvmem_error(EINVAL, "%s: commit of %" PRId64 " tokens, %" PRIu64 " are there already",
				 s->dir, n, have);
	if (tb != s->first)
		return kvmem_error(EINVAL, "%s: commit of %" PRId64 " tokens needs %" PRId64
				 " full blocks staged out, %" PRId64 " are", s->dir, n, tb,
				 s->first);
	if (n % s->B) {
		const int t = (int)(n % s->B);

		if (!s->n_open || !s->ob[0].layer)
			return kvmem_error(EINVAL, "%s: commit of %" PRId64 " tokens: the partial block was "
					 "never written", s->dir, n);
		for (int l = 0; l < s->L; l++) {
			char *pg = s->ob[0].layer[l];

			if (s->ob[0].fill[l] != t)
				return kvmem_error(EINVAL, "%s: commit of %" PRId64 " tokens: layer %d of the "
						 "partial block holds %d", s->dir, n, l,
						 s->ob[0].fill[l]);
			/* Past the tokens, a reused slot holds another page's
			 * bytes (in a shared pool, another workspace's): they
			 * go to this tail file as zeros. */
			for (int h = 0; h < 2 * s->H; h++)
				memset(pg + ((size_t)h * s->B + t) * s->D * s->es, 0,
				       (size_t)(s->B - t) * s->D * s->es);
			if (s->g->dtype == KVMEM_DTYPE_FP8)	/* and their scales */
				for (int h = 0; h < 2 * s->H; h++)
					memset((float *)(pg + 2 * s->pf) + (size_t)h * s->B + t, 0,
					       (size_t)(s->B - t) * sizeof(float));
			layers[l] = pg;
		}
	}
	if (n > (int64_t)have && kvmem_pager_append_tokens(s->p, ids + have, n - have) < 0)
		return kvmem_fail();
	return kvmem_pager_commit(s->p, n % s->B ? layers : NULL, NULL, app, app_len);
}
