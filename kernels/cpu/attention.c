// SPDX-License-Identifier: MIT
/*
 * Causal GQA attention over a head-major KV view (CPU reference).
 *
 * One work item is a block of up to 8 query tokens and one KV head: the
 * query heads that share that KV head are done together, and the block's
 * queries take each tile of keys in turn, so each K and V row is read once
 * for the whole group and block. Each (query, head) output is computed
 * start to end by one thread with the same arithmetic in the same order
 * (keys ascending, a fixed dot-product tree), so the result depends only on
 * the inputs: not on the thread count, not on kv_stride, not on which other
 * queries or heads share the call.
 *
 * Scores, exponentials and the weighted sum of V are fp32; the softmax
 * denominator is summed in double (cheap, and it keeps long views precise).
 * A query that sees no key gets a zero output. If the score buffer cannot
 * be allocated the scores are computed twice instead: same bits, no crash.
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

/* This file's loops vectorise without changing a single result (no
 * reduction is reordered: the dot product spells out its own order). */
#pragma GCC optimize("O3")

/* Dot product in a fixed order: eight running sums, then a fixed tree. */
static inline __attribute__((always_inline)) float dot(const float *restrict a,
							const float *restrict b, int n)
{
	float acc[8] = { 0 };
	int d = 0;

	for (; d + 8 <= n; d += 8)
		for (int k = 0; k < 8; k++)
			acc[k] += a[d + k] * b[d + k];
	float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
		  ((acc[4] + acc[5]) + (acc[6] + acc[7]));
	for (; d < n; d++)
		s += a[d] * b[d];
	return s;
}

/* out[d] += p * v[d] */
static inline __attribute__((always_inline)) void axpy(float *restrict out, float p,
							const float *restrict v, int n)
{
	for (int d = 0; d < n; d++)
		out[d] += p * v[d];
}

struct att_args {
	const float *q, *k, *v;
	const int32_t *q_pos, *kv_pos;
	float *out;
	int n_kv, n_heads, group, head_dim;
	size_t kv_stride;
	float scale;
	int avx2;	/* scores8_avx2 may run here */
};

/* The scores of one query's `grp` heads against the 8 keys at kj (rows of
 * d floats, d a multiple of 8), times scale, into dst[h * stride + r]: the
 * bits of dot() * scale for each, eight keys at a time. Lane e of key r's
 * running sums is dot()'s acc[e] (the same multiplies and adds in the same
 * order: products rounded, then added, no FMA); the two rounds of hadd and
 * the halves' add are dot()'s tree ((a0 + a1) + (a2 + a3)) + ((a4 + a5) +
 * (a6 + a7)) for all eight keys at once, in place of eight horizontal sums. */
__attribute__((target("avx2")))
static void scores8_avx2(const float *qv, const float *kj, int d, int grp, float scale,
			 float *dst, size_t stride)
{
	const __m256 sc = _mm256_set1_ps(scale);

	for (int h = 0; h < grp; h++) {
		const float *qh = qv + (size_t)h * d;
		__m256 acc[8];

		for (int r = 0; r < 8; r++)
			acc[r] = _mm256_setzero_ps();
		for (int e = 0; e < d; e += 8) {
			__m256 qe = _mm256_loadu_ps(qh + e);

			for (int r = 0; r < 8; r++)
				acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(qe,
						_mm256_loadu_ps(kj + (size_t)r * d + e)));
		}
		/* lanes: keys 0-3 pairs (low half sums, then high half sums) */
		__m256 q03 = _mm256_hadd_ps(_mm256_hadd_ps(acc[0], acc[1]),
					    _mm256_hadd_ps(acc[2], acc[3]));
		__m256 q47 = _mm256_hadd_ps(_mm256_hadd_ps(acc[4], acc[5]),
					    _mm256_hadd_ps(acc[6], acc[7]));
		__m256 lo = _mm256_permute2f128_ps(q03, q47, 0x20);
		__m256 hi = _mm256_permute2f128_ps(q03, q47, 0x31);

		_mm256_storeu_ps(dst + (size_t)h * stride,
				 _mm256_mul_ps(_mm256_add_ps(lo, hi), sc));
	}
}

/* out[e] += sum over the visible keys j0 <= j < j1, in order, of p[j] *
 * v[j][e], for d a multiple of 8: axpy()'s bits (each product rounded,
 * then added, key after key) with 64 outputs held in registers across the
 * keys instead of loaded and stored for every key. */
__attribute__((target("avx2")))
static void weighted_v_avx2(float *out, const float *p, const float *vh, const int32_t *kv_pos,
			    int32_t qp, int j0, int j1, int d)
{
	for (int e0 = 0; e0 < d; e0 += 64) {
		const int nv = d - e0 < 64 ? (d - e0) / 8 : 8;
		__m256 acc[8];

		for (int r = 0; r < nv; r++)
			acc[r] = _mm256_loadu_ps(out + e0 + 8 * r);
		for (int j = j0; j < j1; j++) {
			if (kv_pos[j] > qp)
				continue;
			const float *vj = vh + (size_t)j * d + e0;
			const __m256 pj = _mm256_set1_ps(p[j]);

			if (nv == 8) {	/* the common case, unrolled */
				for (int r = 0; r < 8; r++)
					acc[r] = _mm256_add_ps(acc[r],
							       _mm256_mul_ps(pj, _mm256_loadu_ps(vj + 8 * r)));
			} else {
				for (int r = 0; r < nv; r++)
					acc[r] = _mm256_add_ps(acc[r],
							       _mm256_mul_ps(pj, _mm256_loadu_ps(vj + 8 * r)));
			}
		}
		for (int r = 0; r < nv; r++)
			_mm256_storeu_ps(out + e0 + 8 * r, acc[r]);
	}
}

/* Where query i's heads reading KV head g start in q and out. */
static size_t q_at(const struct att_args *a, int i, int g)
{
	return ((size_t)i * a->n_heads + (size_t)g * a->group) * a->head_dim;
}

/* Query token i against KV head g, for the `group` heads reading g, with
 * no score buffer (none could be had): each score is computed twice, for
 * the maximum and then for the weights, with the bits attend_rows gives. */
__attribute__((target_clones("avx2", "default")))
static void attend_group(const struct att_args *a, int i, int g)
{
	int d = a->head_dim, grp = a->group, n_kv = a->n_kv;
	int32_t qp = a->q_pos[i];
	size_t qo = q_at(a, i, g);
	const float *qv = a->q + qo;
	const float *kh = a->k + (size_t)g * a->kv_stride * d;
	const float *vh = a->v + (size_t)g * a->kv_stride * d;
	float *out = a->out + qo;
	float max[grp];
	double sum[grp];
	int seen = 0;

	for (int h = 0; h < grp; h++) {
		max[h] = -INFINITY;
		sum[h] = 0.0;
	}
	for (int j = 0; j < n_kv; j++) {
		if (a->kv_pos[j] > qp)
			continue;
		for (int h = 0; h < grp; h++) {
			float s = dot(qv + (size_t)h * d, kh + (size_t)j * d, d) * a->scale;

			if (s > max[h])
				max[h] = s;
		}
		seen = 1;
	}
	memset(out, 0, sizeof(float) * grp * d);
	if (!seen)
		return;
	for (int j = 0; j < n_kv; j++) {
		if (a->kv_pos[j] > qp)
			continue;
		const float *kj = kh + (size_t)j * d, *vj = vh + (size_t)j * d;

		for (int h = 0; h < grp; h++) {
			float p = expf(dot(qv + (size_t)h * d, kj, d) * a->scale - max[h]);

			sum[h] += p;
			axpy(out + (size_t)h * d, p, vj, d);
		}
	}
	for (int h = 0; h < grp; h++) {
		float inv = (float)(1.0 / sum[h]);

		for (int e = 0; e < d; e++)
			out[(size_t)h * d + e] *= inv;
	}
}

/*
 * Queries i0..i1-1 (at most ROW_BLOCK) against KV head g, for the `group`
 * heads reading g. scores: [i1 - i0][group][n_kv]. The keys go in tiles of
 * KEY_TILE, and every query of the block takes a tile while it is in cache,
 * where one query at a time read the whole view's K and V for each query (a
 * 32-token question over an 8K view of the embedded model on the build
 * machine: 53 -> 45 ms; what is left is the arithmetic, done without FMA
 * for the bits).
 *
 * Each query's result has the bits it has alone: its scores are dot()'s
 * (eight visible keys at a time from scores8_avx2, the same bits), its
 * maximum does not depend on the order, its exponentials and denominator
 * are taken over its keys in order, and each output element adds its terms
 * key after key, tile after tile. Also built for AVX2: the eight running
 * sums of dot() fill one 256-bit register, and with the multiply and the
 * add kept apart (no FMA: ISO C's -ffp-contract=off) every result has the
 * bits of the plain build.
 */
#define ROW_BLOCK 8
#define KEY_TILE 256

__attribute__((target_clones("avx2", "default")))
static void attend_rows(const struct att_args *a, int i0, int i1, int g, float *scores)
{
	const int d = a->head_dim, grp = a->group, n_kv = a->n_kv, nr = i1 - i0;
	const float *kh = a->k + (size_t)g * a->kv_stride * d;
	const float *vh = a->v + (size_t)g * a->kv_stride * d;
	const int wide = d % 8 == 0 && a->avx2;
	float max[nr * grp];
	double sum[nr * grp];
	int seen[ROW_BLOCK] = { 0 };

	for (int x = 0; x < nr * grp; x++)
		max[x] = -INFINITY;
	for (int j0 = 0; j0 < n_kv; j0 += KEY_TILE) {	/* the scores and maxima */
		const int j1 = n_kv - j0 < KEY_TILE ? n_kv : j0 + KEY_TILE;

		for (int r = 0; r < nr; r++) {
			const int32_t qp = a->q_pos[i0 + r];
			const float *qv = a->q + q_at(a, i0 + r, g);
			float *sc = scores + (size_t)r * grp * n_kv, *mx = max + (size_t)r * grp;

			for (int j = j0; j < j1; j++) {
				const float *kj = kh + (size_t)j * d;

				if (wide && j + 8 <= j1) {
					int e = 0;

					while (e < 8 && a->kv_pos[j + e] <= qp)
						e++;
					if (e == 8) {	/* eight visible keys */
						scores8_avx2(qv, kj, d, grp, a->scale, sc + j,
							     (size_t)n_kv);
						for (int h = 0; h < grp; h++)
							for (e = 0; e < 8; e++)
								if (sc[(size_t)h * n_kv + j + e] > mx[h])
									mx[h] = sc[(size_t)h * n_kv + j + e];
						seen[r] = 1;
						j += 7;
						continue;
					}
				}
				if (a->kv_pos[j] > qp)
					continue;
				for (int h = 0; h < grp; h++) {
					float s = dot(qv + (size_t)h * d, kj, d) * a->scale;

					sc[(size_t)h * n_kv + j] = s;
					if (s > mx[h])
						mx[h] = s;
				}
				seen[r] = 1;
			}
		}
	}
	for (int r = 0; r < nr; r++) {	/* the weights, each query's keys in order */
		const int32_t qp = a->q_pos[i0 + r];
		float *out = a->out + q_at(a, i0 + r, g);

		memset(out, 0, sizeof(float) * grp * d);
		for (int h = 0; seen[r] && h < grp; h++) {
			float *sh = scores + ((size_t)r * grp + h) * n_kv;
			double sh_sum = 0.0;

			for (int j = 0; j < n_kv; j++) {
				if (a->kv_pos[j] > qp)
					continue;
				sh[j] = expf(sh[j] - max[r * grp + h]);
				sh_sum += sh[j];
			}
			sum[r * grp + h] = sh_sum;
		}
	}
	for (int j0 = 0; j0 < n_kv; j0 += KEY_TILE) {	/* the weighted sums of V */
		const int j1 = n_kv - j0 < KEY_TILE ? n_kv : j0 + KEY_TILE;

		for (int r = 0; r < nr; r++) {
			const int32_t qp = a->q_pos[i0 + r];
			const float *sc = scores + (size_t)r * grp * n_kv;
			float *out = a->out + q_at(a, i0 + r, g);

			if (!seen[r])
				continue;
			if (wide) {
				for (int h = 0; h < grp; h++)
					weighted_v_avx2(out + (size_t)h * d, sc + (size_t)h * n_kv, vh,
							a->kv_pos, qp, j0, j1, d);
				continue;
			}
			for (int j = j0; j < j1; j++) {
				if (a->kv_pos[j] > qp)
					continue;
				for (int h = 0; h < grp; h++)
					axpy(out + (size_t)h * d, sc[(size_t)h * n_kv + j],
					     vh + (size_t)j * d, d);
			}
		}
	}
	for (int r = 0; r < nr; r++) {
		float *out = a->out + q_at(a, i0 + r, g);

		for (int h = 0; seen[r] && h < grp; h++) {
			float inv = (float)(1.0 / sum[r * grp + h]);

			for (int e = 0; e < d; e++)
				out[(size_t)h * d + e] *= inv;
		}
	}
}

/* A sequence's blocks of up to ROW_BLOCK queries. */
static int row_blocks(int n_q)
{
	return (n_q + ROW_BLOCK - 1) / ROW_BLOCK;
}

/* Work items of a batch: sequence s owns items [first[s], first[s + 1]),
 * n_kv_heads per block of queries, KV head outermost within a sequence
 * (consecutive items share K / V in cache); item w is queries i0..i1-1. */
static void batch_item(const kvmem_att_seq *seqs, const long *first, int n_seqs, long w, int *s,
		       int *i0, int *i1, int *g)
{
	int nb;

	int lo = 0, hi = n_seqs - 1;

	while (lo < hi) {	/* the last s with first[s] <= w */
		int mid = (lo + hi + 1) / 2;

		if (first[mid] <= w)
			lo = mid;
		else
			hi = mid - 1;
	}
	w -= first[lo];
	*s = lo;
	nb = row_blocks(seqs[lo].n_q);
	*i0 = (int)(w % nb) * ROW_BLOCK;
	*i1 = *i0 + ROW_BLOCK < seqs[lo].n_q ? *i0 + ROW_BLOCK : seqs[lo].n_q;
	*g = (int)(w / nb);
}

/* Multiply-adds of a batch (queries x heads x visible keys x head_dim)
 * from which the kernels' pool, and from which OpenMP, runs its items. */
#define POOL_WORK (1 << 18)
#define OMP_WORK (1 << 22)

struct batch_args {
	float *out;
	const float *q;
	const kvmem_att_seq *seqs;
	const long *first;
	int n_seqs, n_heads, head_dim, group, max_kv;
	int rows;	/* the most queries an item takes (a decode batch's: 1) */
	float scale;
	int avx2;
};

static void run_item(const struct batch_args *b, long w, float *scores)
{
	int s, i0, i1, g;

	batch_item(b->seqs, b->first, b->n_seqs, w, &s, &i0, &i1, &g);
	const kvmem_att_seq *a = &b->seqs[s];
	const struct att_args args = {
		.q = b->q + (size_t)a->q0 * b->n_heads * b->head_dim, .k = a->k, .v = a->v,
		.q_pos = a->q_pos, .kv_pos = a->kv_pos,
		.out = b->out + (size_t)a->q0 * b->n_heads * b->head_dim,
		.n_kv = a->n_kv, .n_heads = b->n_heads, .group = b->group,
		.head_dim = b->head_dim, .kv_stride = a->kv_stride, .scale = b->scale,
		.avx2 = b->avx2,
	};

	if (scores) {
		attend_rows(&args, i0, i1, g, scores);
		return;
	}
	for (int i = i0; i < i1; i++)
		attend_group(&args, i, g);
}

/* One item on whichever thread took it, with its own score buffer
 * (none if it cannot be had: the same bits, computed twice). */
static void pool_item(void *arg, int w)
{
	const struct batch_args *b = arg;
	float *scores = malloc(sizeof(float) * b->rows * b->group * b->max_kv);

	run_item(b, w, scores);
	free(scores);
}

void kvmem_attention_batch(float *out, const float *q, const kvmem_att_seq *seqs, int n_seqs,
			   int n_heads, int n_kv_heads, int head_dim, float scale)
{
	long stack[65], *first = n_seqs <= 64 ? stack : malloc(sizeof(long) * ((size_t)n_seqs + 1));
	int max_kv = 1, rows = 1;
	double work = 0;

	if (n_seqs <= 0 || n_heads <= 0 || n_kv_heads <= 0)
		return;
	if (!first) {	/* no memory for the table: one sequence at a time, same bits */
		for (int s = 0; s < n_seqs; s++)
			kvmem_attention_batch(out, q, &seqs[s], 1, n_heads, n_kv_heads, head_dim,
					      scale);
		return;
	}
	first[0] = 0;
	for (int s = 0; s < n_seqs; s++) {
		int n_q = seqs[s].n_q > 0 ? seqs[s].n_q : 0;

		first[s + 1] = first[s] + (long)n_kv_heads * row_blocks(n_q);
		max_kv = seqs[s].n_kv > max_kv ? seqs[s].n_kv : max_kv;
		rows = n_q > rows ? (n_q < ROW_BLOCK ? n_q : ROW_BLOCK) : rows;
		work += (double)n_q * n_heads * (seqs[s].n_kv > 0 ? seqs[s].n_kv : 0) * head_dim;
	}
	const long items = first[n_seqs];
	const int group = n_heads / n_kv_heads;
	int avx2;

	__builtin_cpu_init();
	avx2 = __builtin_cpu_supports("avx2");

	const struct batch_args ba = {
		.out = out, .q = q, .seqs = seqs, .first = first, .n_seqs = n_seqs,
		.n_heads = n_heads, .head_dim = head_dim, .group = group, .max_kv = max_kv,
		.rows = rows,
		.scale = scale, .avx2 = avx2,
	};

	/* A decode batch's items (a few hundred keys each, n_kv_heads a
	 * session: 16 for 8 sessions of the embedded model) go to the
	 * kernels' pool: each takes tens of microseconds, less than an
	 * OpenMP worker under passive waits takes to wake (at 2 threads such
	 * a step took the time of 1). A lone decode step of a short view
	 * stays on this thread. Large work (prefill chunks) keeps OpenMP,
	 * dynamic one item at a time: items differ in cost (views differ in
	 * length, a query sees more of its view than the one before it). */
	if (items > 1 && work >= POOL_WORK && work < OMP_WORK) {
		kvmem_pool_run((int)items, pool_item, (void *)&ba);
	} else {
		#pragma omp parallel if (items > 1 && work >= OMP_WORK)
		{
			float *scores = malloc(sizeof(float) * rows * group * max_kv);

			#pragma omp for schedule(dynamic, 1)
			for (long w = 0; w < items; w++)
				run_item(&ba, w, scores);
			free(scores);
		}
	}
	if (first != stack)
		free(first);
}

void kvmem_attention(float *out, const float *q, const int32_t *q_pos, int n_q,
		   const float *k, const float *v, const int32_t *kv_pos, int n_kv,
		   size_t kv_stride, int n_heads, int n_kv_heads, int head_dim, float scale)
{
	const kvmem_att_seq one = { .q0 = 0, .n_q = n_q, .q_pos = q_pos, .k = k, .v = v,
				    .kv_pos = kv_pos, .n_kv = n_kv, .kv_stride = kv_stride };

	if (n_q <= 0)
		return;
	kvmem_attention_batch(out, q, &one, 1, n_heads, n_kv_heads, head_dim, scale);
}
