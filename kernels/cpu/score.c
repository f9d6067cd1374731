// SPDX-License-Identifier: MIT
/*
 * Selection scorers over plain arrays (kernels_bf16.h): the CPU twins of
 * kernels/cuda/score.cu and the arithmetic of the workspace policies
 * (user/select/score.c, policy_meank.c, policy_subblock.c,
 * policy_quest.c, token_mass.c, plan.c's top-k), kept in the same order so a
 * policy that calls these gets the bits it got before:
 *
 *   dots     sixteen lanes in four chains over 64-element steps, folded in a
 *            fixed tree; no FMA (ISO C mode contracts nothing)
 *   mass     per pair: items in chunks of 4096; the chunks' maxima, then
 *            expf(z - max) with the chunk sums in double, the chunk sums added
 *            in order, inv = (float)(1 / total); per block the shares of its
 *            items summed in order in fp32 and added to the score, pairs in
 *            order. Chunks run in parallel; nothing depends on the threads.
 *
 * The index may be fp32 (the workspace's) or bf16 (kvmem_score_geom.
 * index_dtype); bf16 rows are widened exactly before the same dots.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_bf16.h"
#include "kvmem/kvmem.h"

#define MASS_CHUNK 4096		/* items per work unit: a multiple of 4 */
#define MASS_SCRATCH (16u << 20)	/* logits kept at once, in floats (64 MiB) */
#define SUBS 4			/* quarter blocks (KVMEM_SUBBLOCKS) */

/* out = q . row in the workspace's fixed order, for any d. */
static float dot_fixed(const float *q, const float *row, int d)
{
	float a[4][16] = { { 0 } }, s[16];
	int j = 0;

	for (; j + 64 <= d; j += 64)
		for (int c = 0; c < 4; c++)
			for (int u = 0; u < 16; u++)
				a[c][u] += q[j + 16 * c + u] * row[j + 16 * c + u];
	for (int u = 0; u < 16; u++)
		s[u] = (a[0][u] + a[1][u]) + (a[2][u] + a[3][u]);
	for (; j + 16 <= d; j += 16)
		for (int u = 0; u < 16; u++)
			s[u] += q[j + u] * row[j + u];
	for (; j < d; j++)
		s[j & 15] += q[j] * row[j];
	for (int u = 0; u < 8; u++)
		s[u] += s[u + 8];
	return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

/* Row i of an index array of dtype dt (fp32 or bf16), as fp32 in buf. */
static const float *row_at(const void *base, int dt, size_t i, int d, float *buf)
{
	if (dt == KVMEM_DTYPE_BF16) {
		kvmem_bf16_to_f32_n(buf, (const uint16_t *)base + i * d, d);
		return buf;
	}
	return (const float *)base + i * d;
}

static float log_len(int len)
{
	return len > 0 ? logf((float)len) : -INFINITY;
}

static float head_scale(int head_dim)
{
	return 1.0f / sqrtf((float)head_dim);
}

/* ---- queries -------------------------------------------------------------- */

/* sum_{t<n} cos(w t) and sin(w t) in closed form (a geometric sum). */
static void rope_sums(double w, double n, double *cs, double *sn)
{
	double h = sin(w / 2);

	if (fabs(h) < 1e-12) {	/* no turn at all within the span */
		*cs = n;
		*sn = 0;
		return;
	}
	*cs = sin(n * w / 2) / h * cos((n - 1) * w / 2);
	*sn = sin(n * w / 2) / h * sin((n - 1) * w / 2);
}

void kvmem_rope_mean(float *x, int head_dim, double theta, int64_t span)
{
	const int half = head_dim / 2;
	const double n = (double)span;

	if (span <= 0)
		return;
	for (int i = 0; i < half; i++) {
		double C, S, a = x[i], b = x[i + half];

		rope_sums(pow(theta, -2.0 * i / head_dim), n, &C, &S);
		C /= n;
		S /= n;
		x[i] = (float)(C * a - S * b);
		x[i + half] = (float)(C * b + S * a);
	}
}

void kvmem_group_queries(float *gq, const float *q, int n_layers, int n_q, int n_heads,
			 int n_kv_heads, int head_dim, double theta, int64_t span)
{
	const int group = n_heads / n_kv_heads, d = head_dim;
	const float inv = 1.0f / (float)(group * (n_q > 0 ? n_q : 1));

	for (int l = 0; l < n_layers; l++)
		for (int g = 0; g < n_kv_heads; g++) {
			float *out = gq + ((size_t)l * n_kv_heads + g) * d;

			memset(out, 0, d * sizeof(float));
			for (int t = 0; t < n_q; t++)
				for (int h = g * group; h < (g + 1) * group; h++) {
					const float *qh = q + (((size_t)l * n_q + t) * n_heads + h) * d;

					for (int i = 0; i < d; i++)
						out[i] += qh[i];
				}
			for (int i = 0; i < d; i++)
				out[i] *= inv;
			kvmem_rope_mean(out, d, theta, span);
		}
}

void kvmem_head_queries(float *hq, const float *q, int layer, int n_q, int n_heads,
			int head_dim, double theta, int64_t span)
{
	for (int p = 0; p < n_heads * n_q; p++) {
		float *out = hq + (size_t)p * head_dim;

		memcpy(out, q + (((size_t)layer * n_q + p % n_q) * n_heads + p / n_q) * head_dim,
		       head_dim * sizeof(float));
		kvmem_rope_mean(out, head_dim, theta, span);
	}
}

/* ---- mass --------------------------------------------------------------- */

/* Fill z[0 .. i1-i0) with the log-weights of items i0..i1-1 of pair p. */
typedef void (*logit_fn)(const void *arg, int p, int64_t i0, int64_t i1, float *z);

/* The softmax mass: see the file comment. scores[rows][n_items/per]
 * must hold zeros or earlier sums; row[p] (NULL: 0) picks a pair's row. */
static int mass(float *scores, int64_t n_items, int per, int n_pairs, const int *row,
		logit_fn fn, const void *arg)
{
	const int64_t n_chunks = (n_items + MASS_CHUNK - 1) / MASS_CHUNK, nb = n_items / per;
	int64_t g_max = n_items ? (int64_t)MASS_SCRATCH / n_items : n_pairs;
	int G = g_max < 1 ? 1 : (g_max > n_pairs ? n_pairs : (int)g_max);
	float *z, *cmax, *mx, *inv;
	double *csum;

	if (n_items <= 0 || n_pairs <= 0)
		return 0;
	z = malloc(sizeof(float) * G * n_items);
	cmax = malloc(sizeof(float) * G * n_chunks);
	csum = malloc(sizeof(double) * G * n_chunks);
	mx = malloc(sizeof(float) * G);
	inv = malloc(sizeof(float) * G);
	if (!z || !cmax || !csum || !mx || !inv) {
		free(z);
		free(cmax);
		free(csum);
		free(mx);
		free(inv);
		return kvmem_error(ENOMEM, "score: out of memory for %lld items", (long long)n_items);
	}
	for (int g0 = 0; g0 < n_pairs; g0 += G) {
		const int gn = n_pairs - g0 < G ? n_pairs - g0 : G;

#pragma omp parallel if (n_items * gn > 16384)
		{
#pragma omp for schedule(static)
			for (int64_t c = 0; c < n_chunks; c++) {
				int64_t a = c * MASS_CHUNK, b = a + MASS_CHUNK < n_items ? a + MASS_CHUNK : n_items;

				for (int j = 0; j < gn; j++) {
					float *zj = z + (size_t)j * n_items, m = -INFINITY;

					fn(arg, g0 + j, a, b, zj + a);
					for (int64_t i = a; i < b; i++)
						m = zj[i] > m ? zj[i] : m;
					cmax[(size_t)j * n_chunks + c] = m;
				}
			}
#pragma omp single
			for (int j = 0; j < gn; j++) {
				mx[j] = -INFINITY;
				for (int64_t c = 0; c < n_chunks; c++)
					mx[j] = cmax[(size_t)j * n_chunks + c] > mx[j] ?
						cmax[(size_t)j * n_chunks + c] : mx[j];
			}
#pragma omp for schedule(static)
			for (int64_t c = 0; c < n_chunks; c++) {
				int64_t a = c * MASS_CHUNK, b = a + MASS_CHUNK < n_items ? a + MASS_CHUNK : n_items;

				for (int j = 0; j < gn; j++) {
					float *zj = z + (size_t)j * n_items;
					double s = 0;

					for (int64_t i = a; i < b; i++) {
						/* A pair with no weight anywhere adds nothing. */
						zj[i] = mx[j] == -INFINITY ? 0 : expf(zj[i] - mx[j]);
						s += zj[i];
					}
					csum[(size_t)j * n_chunks + c] = s;
				}
			}
#pragma omp single
			for (int j = 0; j < gn; j++) {
				double total = 0;

				for (int64_t c = 0; c < n_chunks; c++)
					total += csum[(size_t)j * n_chunks + c];
				inv[j] = total > 0 ? (float)(1.0 / total) : 0;
			}
#pragma omp for schedule(static)
			for (int64_t c = 0; c < n_chunks; c++) {
				int64_t a = c * MASS_CHUNK / per;
				int64_t b = (c + 1) * MASS_CHUNK / per < nb ? (c + 1) * MASS_CHUNK / per : nb;

				for (int64_t blk = a; blk < b; blk++)
					for (int j = 0; j < gn; j++) {
						const float *zj = z + (size_t)j * n_items + blk * per;
						float s = 0;

						for (int k = 0; k < per; k++)
							s += zj[k];
						scores[(size_t)(row ? row[g0 + j] : 0) * nb + blk] += s * inv[j];
					}
			}
		}
	}
	free(z);
	free(cmax);
	free(csum);
	free(mx);
	free(inv);
	return 0;
}

/* ---- meank and subblock ------------------------------------------------- */

struct mean_arg {
	const kvmem_score_geom *g;
	const void *rows;	/* meank [L*H][cap][D] or sub [L*H][cap*4][D] */
	const float *gq;	/* [L*H][D] */
	int per;		/* items per block: 1 or 4 */
	float scale, full, last[SUBS];
};

/* Pair p = layer * H + KV head: z = s q.mu + log n over items i0..i1-1. */
static void mean_logits(const void *arg, int p, int64_t i0, int64_t i1, float *z)
{
	const struct mean_arg *a = arg;
	const kvmem_score_geom *g = a->g;
	const int d = g->head_dim;
	float buf[d > 0 ? d : 1];
	size_t base = (size_t)p * g->cap_blocks * a->per;

	for (int64_t i = i0; i < i1; i++) {
		int64_t b = i / a->per;
		float w = b == g->n_blocks - 1 ? a->last[i % a->per] : a->full;
		float dot = dot_fixed(a->gq + (size_t)p * d,
				      row_at(a->rows, g->index_dtype, base + i, d, buf), d);

		/* An item not yet begun has no weight (no mean). */
		z[i - i0] = w == -INFINITY ? -INFINITY : dot * a->scale + w;
	}
}

static int check_geom(const kvmem_score_geom *g, const char *who)
{
	if (g->n_layers <= 0 || g->n_kv_heads <= 0 || g->n_heads < g->n_kv_heads ||
	    g->n_heads % g->n_kv_heads || g->head_dim <= 0 || g->head_dim > 1024 ||
	    g->block < SUBS || g->n_blocks < 0 || g->cap_blocks < g->n_blocks ||
	    (g->n_blocks > 0 && (g->last_len < 1 || g->last_len > g->block)) ||
	    (g->index_dtype != KVMEM_DTYPE_F32 && g->index_dtype != KVMEM_DTYPE_BF16))
		return kvmem_error(EINVAL, "%s: bad geometry (%d layers, %d/%d heads, head_dim %d, "
				   "block %d, %lld of %lld blocks, last %d, dtype %d)", who,
				   g->n_layers, g->n_heads, g->n_kv_heads, g->head_dim, g->block,
				   (long long)g->n_blocks, (long long)g->cap_blocks, g->last_len,
				   g->index_dtype);
	return 0;
}

int kvmem_score_meank(float *scores, const void *meank, const float *gq,
		      const kvmem_score_geom *g)
{
	struct mean_arg a = { .g = g, .rows = meank, .gq = gq, .per = 1,
			      .scale = head_scale(g->head_dim), .full = logf((float)g->block),
			      .last = { log_len(g->last_len) } };

	if (check_geom(g, "meank"))
		return kvmem_fail();
	memset(scores, 0, sizeof(float) * g->n_blocks);
	return mass(scores, g->n_blocks, 1, g->n_layers * g->n_kv_heads, NULL, mean_logits, &a);
}

int kvmem_score_subblock(float *scores, const void *sub, const float *gq,
			 const kvmem_score_geom *g)
{
	struct mean_arg a = { .g = g, .rows = sub, .gq = gq, .per = SUBS,
			      .scale = head_scale(g->head_dim),
			      .full = logf((float)(g->block / SUBS)) };

	if (check_geom(g, "subblock"))
		return kvmem_fail();
	for (int s = 0; s < SUBS; s++)
		a.last[s] = log_len(g->last_sub[s]);
	memset(scores, 0, sizeof(float) * g->n_blocks);
	return mass(scores, g->n_blocks * SUBS, SUBS, g->n_layers * g->n_kv_heads, NULL,
		    mean_logits, &a);
}

/* ---- quest -------------------------------------------------------------- */

struct quest_arg {
	const kvmem_score_geom *g;
	const void *lo, *hi;
	const float *q;
	int n_q;
	float scale, full, last;
};

/* Pair p = (layer * n_heads + head) * n_q + token. */
static void quest_logits(const void *arg, int p, int64_t i0, int64_t i1, float *z)
{
	const struct quest_arg *a = arg;
	const kvmem_score_geom *g = a->g;
	const int d = g->head_dim, t = p % a->n_q, h = p / a->n_q % g->n_heads;
	const int l = p / a->n_q / g->n_heads, kv = h / (g->n_heads / g->n_kv_heads);
	const float *q = a->q + (((size_t)l * a->n_q + t) * g->n_heads + h) * d;
	size_t base = ((size_t)l * g->n_kv_heads + kv) * g->cap_blocks;
	float bl[d > 0 ? d : 1], bh[d > 0 ? d : 1];

	for (int64_t b = i0; b < i1; b++) {
		const float *lo = row_at(a->lo, g->index_dtype, base + b, d, bl);
		const float *hi = row_at(a->hi, g->index_dtype, base + b, d, bh);
		float u = 0;

		for (int i = 0; i < d; i++) {
			float x = q[i] * lo[i], y = q[i] * hi[i];

			u += x > y ? x : y;
		}
		z[b - i0] = u * a->scale + (b == g->n_blocks - 1 ? a->last : a->full);
	}
}

int kvmem_score_quest(float *scores, const void *kmin, const void *kmax, const float *q,
		      int n_q, const kvmem_score_geom *g)
{
	const int pairs = g->n_layers * g->n_heads * n_q;
	struct quest_arg a = { .g = g, .lo = kmin, .hi = kmax, .q = q, .n_q = n_q,
			       .scale = head_scale(g->head_dim), .full = logf((float)g->block),
			       .last = log_len(g->last_len) };
	int *row, rc;

	if (check_geom(g, "quest"))
		return kvmem_fail();
	memset(scores, 0, sizeof(float) * g->n_layers * g->n_blocks);
	if (n_q <= 0)
		return 0;
	row = malloc(sizeof(int) * pairs);
	if (!row)
		return kvmem_error(ENOMEM, "quest: out of memory");
	for (int p = 0; p < pairs; p++)
		row[p] = p / n_q / g->n_heads;
	rc = mass(scores, g->n_blocks, 1, pairs, row, quest_logits, &a);
	free(row);
	return rc;
}

/* ---- refine's per-key pass ---------------------------------------------- */

/* Pair p (query head p / n_q, token p % n_q): softmax over the listed keys
 * it may see, shares per block into part[0..n). z: n * block floats. */
static void pair_shares(double *part, float *z, const void *keys, const int32_t *len,
			const int64_t *blocks, int64_t n, const float *hq, const int64_t *q_pos,
			int n_q, const kvmem_score_geom *g, int p)
{
	const int d = g->head_dim, B = g->block, group = g->n_heads / g->n_kv_heads;
	const int h = p / n_q, tok = p % n_q;
	const int64_t qpos = q_pos[tok], slots = n * B;
	const float s = head_scale(d);
	size_t base = (size_t)(h / group) * slots;
	float buf[d > 0 ? d : 1], mx = -INFINITY;
	double tot = 0;

	for (int64_t i = 0; i < slots; i++)
		z[i] = dot_fixed(hq + (size_t)p * d, row_at(keys, g->index_dtype, base + i, d, buf), d);
	for (int64_t i = 0; i < n; i++)
		for (int j = 0; j < B; j++) {
			float *zj = z + i * B + j;

			*zj = j < len[i] && blocks[i] * B + j <= qpos ? *zj * s : -INFINITY;
			mx = *zj > mx ? *zj : mx;
		}
	for (int64_t i = 0; i < n; i++) {
		part[i] = 0;
		if (mx == -INFINITY)	/* sees none of them: adds nothing */
			continue;
		for (int j = 0; j < B; j++)
			part[i] += exp((double)z[i * B + j] - mx);
		tot += part[i];
	}
	for (int64_t i = 0; i < n && tot > 0; i++)
		part[i] /= tot;
}

int kvmem_token_mass(double *mass_out, const void *keys, const int32_t *len, const int64_t *blocks,
		     int64_t n, const float *hq, const int64_t *q_pos, int n_q,
		     const kvmem_score_geom *g)
{
	const int pairs = g->n_heads * n_q;
	double *part;
	int oom = 0;

	if (check_geom(g, "token mass"))
		return kvmem_fail();
	if (n <= 0 || pairs <= 0)
		return 0;
	part = malloc(sizeof(double) * pairs * n);
	if (!part)
		return kvmem_error(ENOMEM, "token mass: out of memory for %lld blocks", (long long)n);
	/* One thread per pair, sums in a fixed order afterwards. */
#pragma omp parallel reduction(| : oom) if (n * g->block * pairs > 65536)
	{
		float *z = malloc(sizeof(float) * n * g->block);

#pragma omp for schedule(static)
		for (int p = 0; p < pairs; p++)
			if (z)
				pair_shares(part + (size_t)p * n, z, keys, len, blocks, n, hq, q_pos, n_q,
					    g, p);
		oom |= !z;
		free(z);
	}
	if (oom) {
		free(part);
		return kvmem_error(ENOMEM, "token mass: out of memory for %lld blocks", (long long)n);
	}
	for (int p = 0; p < pairs; p++)
		for (int64_t i = 0; i < n; i++)
			mass_out[i] += part[(size_t)p * n + i];
	free(part);
	return 0;
}

/* ---- top-k -------------------------------------------------------------- */

static inline float key_of(float s)
{
	return isnan(s) ? -INFINITY : s;
}

/* a before b: higher score, then the later block (the planner's order). */
static inline int better(const float *sc, int64_t a, int64_t b)
{
	float x = key_of(sc[a]), y = key_of(sc[b]);

	return x > y || (x == y && a > b);
}

static int by_block(const void *pa, const void *pb)
{
	int64_t x = *(const int64_t *)pa, y = *(const int64_t *)pb;

	return (x > y) - (x < y);
}

static inline void swap64(int64_t *a, int64_t *b)
{
	int64_t t = *a;

	*a = *b;
	*b = t;
}

void kvmem_top_k_select(int64_t *idx, int64_t n, int64_t k, const float *scores)
{
	int64_t lo = 0, hi = n - 1;

	if (k <= 0 || k >= n)
		return;
	/* Quickselect (median of three) until the k best are idx[0..k). */
	while (lo < hi) {
		int64_t mid = lo + (hi - lo) / 2, i = lo, j = hi, pivot;

		if (better(scores, idx[mid], idx[lo]))
			swap64(&idx[mid], &idx[lo]);
		if (better(scores, idx[hi], idx[lo]))
			swap64(&idx[hi], &idx[lo]);
		if (better(scores, idx[hi], idx[mid]))
			swap64(&idx[hi], &idx[mid]);
		pivot = idx[mid];
		while (i <= j) {
			while (better(scores, idx[i], pivot))
				i++;
			while (better(scores, pivot, idx[j]))
				j--;
			if (i <= j) {
				swap64(&idx[i], &idx[j]);
				i++;
				j--;
			}
		}
		if (k - 1 <= j)
			hi = j;
		else if (k - 1 >= i)
			lo = i;
		else
			break;
	}
}

int64_t kvmem_top_k_blocks(int64_t *out, const float *scores, int64_t n, int64_t k)
{
	int64_t *idx;

	if (k <= 0 || n <= 0)
		return 0;
	if (k > n)
		k = n;
	idx = malloc(sizeof(int64_t) * n);
	if (!idx)
		return kvmem_error(ENOMEM, "top-k: out of memory for %lld blocks", (long long)n);
	for (int64_t i = 0; i < n; i++)
		idx[i] = i;
	kvmem_top_k_select(idx, n, k, scores);
	qsort(idx, k, sizeof(int64_t), by_block);
	memcpy(out, idx, sizeof(int64_t) * k);
	free(idx);
	return k;
}
