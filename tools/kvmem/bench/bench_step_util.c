// SPDX-License-Identifier: MIT
/*
 * kvmem bench step: the helpers its phases share (ratios and rates, random
 * bf16 data and token ids, removing a workspace, the backend's placement
 * counters, a prefill into a view, a workspace of random pages written
 * through the pager, the median).
 */
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench_step.h"

/* "52x faster", or "1.4x slower": a ratio below 1 is said as what it is. */
const char *vs(char *buf, size_t n, double peer_s, double t_s)
{
	double r = t_s > 0 ? peer_s / t_s : 0;

	if (r >= 1)
		snprintf(buf, n, "%.*fx faster", r < 10 ? 1 : 0, r);
	else
		snprintf(buf, n, "%.1fx slower", r > 0 ? 1 / r : 0.0);
	return buf;
}

double gbps(double bytes, double s)
{
	return s > 0 ? bytes / s / 1e9 : 0;
}

uint64_t xs(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Random bf16 values in [-2, 2): 16 MiB drawn, the rest repeats it at a
 * shifting offset (the values do not matter to the copies; they only have
 * to be finite). */
void fill_bf16(void *dst, size_t bytes, uint64_t seed)
{
	const size_t src_n = 8u << 20;	/* elements */
	uint16_t *p = dst;
	size_t n = bytes / 2;
	uint64_t r = seed | 1;

	for (size_t i = 0; i < n && i < src_n; i++)
		p[i] = kvmem_f32_to_bf16((float)((double)(xs(&r) >> 11) * 0x1p-53 * 4 - 2));
	for (size_t at = src_n, k = 0; at < n; at += src_n, k++) {
		size_t m = n - at < src_n ? n - at : src_n, sh = (k * 7919) % 4096;

		memcpy(p + at, p + sh, (m < src_n - sh ? m : src_n - sh) * 2);
		if (m > src_n - sh)
			memcpy(p + at + (src_n - sh), p, (m - (src_n - sh)) * 2);
	}
}

void random_ids(int32_t *ids, int64_t n, int vocab, uint64_t seed)
{
	uint64_t r = kvmem_rng_seed(seed);

	for (int64_t i = 0; i < n; i++)
		ids[i] = (int32_t)(kvmem_rng_uniform(&r) * vocab);
}

static int rm_one(const char *path, const struct stat *sb, int type, struct FTW *f)
{
	return remove(path);
}

void rm_rf(const char *path)
{
	nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

void place_delta(struct ctx *x, const kvmem_place_stats *a, kvmem_place_stats *d)
{
	kvmem_place_stats b = { 0 };

	if (x->b->ops->place_stats)
		x->b->ops->place_stats(x->b->ctx, &b);
	d->calls = b.calls - a->calls;
	d->items = b.items - a->items;
	d->tokens = b.tokens - a->tokens;
	d->bytes_in = b.bytes_in - a->bytes_in;
	d->bytes_staged = b.bytes_staged - a->bytes_staged;
	d->pool_hits = b.pool_hits - a->pool_hits;
	d->pool_misses = b.pool_misses - a->pool_misses;
	d->pool_pages = b.pool_pages;
	d->ns = b.ns - a->ns;
	d->moved_tokens = b.moved_tokens - a->moved_tokens;
	d->move_ns = b.move_ns - a->move_ns;
	d->pool_bytes = b.pool_bytes - a->pool_bytes;
	d->pool_cap = b.pool_cap;
	d->filled_pages = b.filled_pages - a->filled_pages;
	d->filled_bytes = b.filled_bytes - a->filled_bytes;
	d->fill_ns = b.fill_ns - a->fill_ns;
	d->move_staged_tokens = b.move_staged_tokens - a->move_staged_tokens;
}

void place_now(struct ctx *x, kvmem_place_stats *s)
{
	memset(s, 0, sizeof(*s));
	if (x->b->ops->place_stats)
		x->b->ops->place_stats(x->b->ctx, s);
}

/* Prefill n random tokens into v (from length 0) in chunks; seconds. */
double prefill_view(struct ctx *x, kvmem_view *v, int64_t n, int chunk, float *logits)
{
	int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
	double t0;

	if (!ids) {
		kvmem_error(ENOMEM, "out of memory");
		return -1;
	}
	random_ids(ids, n, x->geo.cfg.vocab, x->o.seed + 7);
	/* Room for the warm-up and the timed decode steps that follow. */
	if (x->b->ops->set_length(x->b->ctx, v, 0) < 0 ||
	    x->b->ops->reserve(x->b->ctx, v, n + 8 + x->o.decode) < 0) {
		free(ids);
		return -1;
	}
	t0 = cli_now_s();
	for (int64_t at = 0; at < n; at += chunk) {
		int k = n - at < chunk ? (int)(n - at) : chunk;

		if (x->b->ops->forward(x->b->ctx, v, ids + at, k, at + k == n ? logits : NULL, 0,
				       NULL) < 0) {
			free(ids);
			return -1;
		}
	}
	free(ids);
	return cli_now_s() - t0;
}

/* ---- a workspace of random pages, written through the pager ---------------- */
void geom_of(const struct ctx *x, const kvmem_model *m, kvmem_page_geom *g)
{
	kvmem_page_geom_model(g, m, BLOCK);
	g->dtype = x->o.kv_dtype;
}

/* Random bytes made fit for fp8 pages: every byte 0x3N or 0xbN, N < 8, is
 * an e4m3 value of magnitude 0.5..0.94, and every 4 of them a finite fp32
 * scale; no NaN anywhere, wherever a page's scales fall. */
void fp8_valid(char *p, size_t bytes)
{
	for (size_t i = 0; i < bytes; i++)
		p[i] = (char)((p[i] & 0x87) | 0x30);
}

/* tokens (a multiple of BLOCK) of random pages and ids, committed. */
int make_workspace(struct ctx *x, const kvmem_model *m, const char *dir, int64_t tokens,
		   double *secs)
{
	kvmem_page_geom g;
	kvmem_pager_opts po;
	kvmem_pager *p = NULL;
	const int L = m->cfg.n_layers;
	const void **layers = calloc(L, sizeof(*layers));
	size_t pb, src_bytes = 64u << 20;
	char *src = NULL;
	int32_t *ids = malloc(sizeof(int32_t) * 65536);
	double t0 = cli_now_s();
	int rc = -1;

	geom_of(x, m, &g);
	pb = kvmem_page_bytes(&g);
	if (!layers || !ids || posix_memalign((void **)&src, 4096, src_bytes + pb)) {
		kvmem_error(ENOMEM, "out of memory");
		goto out;
	}
	fill_bf16(src, src_bytes + pb, x->o.seed ^ (uint64_t)tokens);
	/* fp8 pages (bytes, then scales, at any 4096-byte offset of src) */
	if (g.dtype == KVMEM_DTYPE_FP8)
		fp8_valid(src, src_bytes + pb);
	rm_rf(dir);
	kvmem_pager_opts_default(&po);
	po.flags = KVMEM_PAGER_CREATE | KVMEM_PAGER_NO_KEEP;
	po.host_cap = 64ull << 20;
	po.stage_bytes = 256ull << 20;
	if (kvmem_pager_open(dir, &g, &po, &p) < 0)
		goto out;
	for (int64_t at = 0; at < tokens; at += 65536) {
		int64_t n = tokens - at < 65536 ? tokens - at : 65536;

		random_ids(ids, n, m->cfg.vocab, x->o.seed + (uint64_t)at);
		if (kvmem_pager_append_tokens(p, ids, n) < 0)
			goto out;
	}
	for (int64_t b = 0; b < tokens / BLOCK; b++) {
		for (int l = 0; l < L; l++) {
			uint64_t h = (uint64_t)(b * L + l) * 0x9e3779b97f4a7c15ull;

			layers[l] = src + ((h >> 20) % (src_bytes / 4096)) * 4096;
		}
		if (kvmem_pager_append_block(p, (uint64_t)b, layers, NULL) < 0)
			goto out;
	}
	if (kvmem_pager_commit(p, NULL, NULL, NULL, 0) < 0)
		goto out;
	rc = 0;
out:
	if (p && kvmem_pager_close(p) < 0)
		rc = -1;
	free(layers);
	free(ids);
	free(src);
	*secs = cli_now_s() - t0;
	return rc;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

double median(const double *v, int n)
{
	double s[64];

	memcpy(s, v, sizeof(double) * n);
	qsort(s, n, sizeof(double), cmp_d);
	return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}
