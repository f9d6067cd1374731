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
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/vexp.h"
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
	int avx512;	/* and scores8_512, weighted_v_512 (AVX-512 F and DQ) */
	int vexp;	/* the softmax's width (vexp_width) */
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

/* ---- AVX-512: two heads a register -------------------------------------
 * A zmm register holds the running sums of two heads (lanes 0-7 head 2p,
 * lanes 8-15 head 2p + 1) against one key, or the weighted sums of V of
 * 16 outputs: each lane does what the AVX2 code's lane does, in the same
 * order (products rounded, then added), half the instructions for the
 * same bits. The embedded model's decode batch of 8 spent a quarter of its
 * step in this kernel (issue #26). */

/* The most query floats attend_rows pairs on its stack (16 KB: 8 heads of
 * 512, 16 of 256); a larger group takes the AVX2 scores. */
#define PAIR_FLOATS 4096

/* The query's heads as pairs for scores8_512: qp[p][e / 8][16] holds
 * q[2p][e .. e + 7] and then q[2p + 1][e .. e + 7]. */
static void pair_heads(float *qp, const float *qv, int d, int grp)
{
	for (int p = 0; p < grp / 2; p++)
		for (int e = 0; e < d; e += 8) {
			float *o = qp + (size_t)p * 2 * d + 2 * e;

			memcpy(o, qv + (size_t)2 * p * d + e, sizeof(float) * 8);
			memcpy(o + 8, qv + (size_t)(2 * p + 1) * d + e, sizeof(float) * 8);
		}
}

/* dot()'s tree for eight keys' running sums at once: lane r of the result
 * is ((a[r]0 + a[r]1) + (a[r]2 + a[r]3)) + ((a[r]4 + a[r]5) + (a[r]6 + a[r]7)). */
__attribute__((target("avx2"), always_inline)) static inline __m256 tree8(const __m256 *a)
{
	__m256 q03 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
	__m256 q47 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));

	return _mm256_add_ps(_mm256_permute2f128_ps(q03, q47, 0x20),
			     _mm256_permute2f128_ps(q03, q47, 0x31));
}

/* scores8_avx2's bits for an even number of heads, two at a time. */
__attribute__((target("avx512f,avx512dq,avx2")))
static void scores8_512(const float *qp, const float *kj, int d, int grp, float scale, float *dst,
			size_t stride)
{
	const __m256 sc = _mm256_set1_ps(scale);

	for (int p = 0; p < grp / 2; p++) {
		const float *qq = qp + (size_t)p * 2 * d;
		__m512 acc[8];
		__m256 lo[8], hi[8];

		for (int r = 0; r < 8; r++)
			acc[r] = _mm512_setzero_ps();
		for (int e = 0; e < d; e += 8) {
			__m512 qe = _mm512_loadu_ps(qq + 2 * e);

			for (int r = 0; r < 8; r++)
				acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(qe,
						_mm512_broadcast_f32x8(_mm256_loadu_ps(kj + (size_t)r * d + e))));
		}
		for (int r = 0; r < 8; r++) {
			lo[r] = _mm512_castps512_ps256(acc[r]);
			hi[r] = _mm512_extractf32x8_ps(acc[r], 1);
		}
		_mm256_storeu_ps(dst + (size_t)2 * p * stride, _mm256_mul_ps(tree8(lo), sc));
		_mm256_storeu_ps(dst + (size_t)(2 * p + 1) * stride, _mm256_mul_ps(tree8(hi), sc));
	}
}

/* weighted_v_avx2's bits for NH heads x NV registers of 16 outputs, each
 * visible key's V row read once for all NH heads. */
__attribute__((target("avx512f"), always_inline)) static inline void
wv_tile512(float *out, const float *p, size_t p_stride, const float *vh, const int32_t *kv_pos,
	   int32_t qp, int j0, int j1, int d, int e0, const int NH, const int NV)
{
	__m512 acc[4][4];

	for (int h = 0; h < NH; h++)
		for (int c = 0; c < NV; c++)
			acc[h][c] = _mm512_loadu_ps(out + (size_t)h * d + e0 + 16 * c);
	for (int j = j0; j < j1; j++) {
		if (kv_pos[j] > qp)
			continue;
		const float *vj = vh + (size_t)j * d + e0;
		__m512 vv[4];

		for (int c = 0; c < NV; c++)
			vv[c] = _mm512_loadu_ps(vj + 16 * c);
		for (int h = 0; h < NH; h++) {
			const __m512 pj = _mm512_set1_ps(p[(size_t)h * p_stride + j]);

			for (int c = 0; c < NV; c++)
				acc[h][c] = _mm512_add_ps(acc[h][c], _mm512_mul_ps(pj, vv[c]));
		}
	}
	for (int h = 0; h < NH; h++)
		for (int c = 0; c < NV; c++)
			_mm512_storeu_ps(out + (size_t)h * d + e0 + 16 * c, acc[h][c]);
}

/* out[h][e] += the visible keys' p[h][j] * v[j][e], key after key, for the
 * grp heads at once; d a multiple of 16. */
__attribute__((target("avx512f")))
static void weighted_v_512(float *out, const float *p, size_t p_stride, const float *vh,
			   const int32_t *kv_pos, int32_t qp, int j0, int j1, int d, int grp)
{
	for (int h = 0; h < grp; h += 4) {
		const int nh = grp - h < 4 ? grp - h : 4;
		float *oh = out + (size_t)h * d;
		const float *ph = p + (size_t)h * p_stride;

		for (int e0 = 0; e0 < d; e0 += 64) {
			const int nv = d - e0 < 64 ? (d - e0) / 16 : 4;

			if (nh == 4 && nv == 4)	/* the common shapes, unrolled */
				wv_tile512(oh, ph, p_stride, vh, kv_pos, qp, j0, j1, d, e0, 4, 4);
			else if (nh == 2 && nv == 4)
				wv_tile512(oh, ph, p_stride, vh, kv_pos, qp, j0, j1, d, e0, 2, 4);
			else if (nh == 1 && nv == 4)
				wv_tile512(oh, ph, p_stride, vh, kv_pos, qp, j0, j1, d, e0, 1, 4);
			else
				for (int x = 0; x < nh; x++)
					for (int c = 0; c < nv; c++)
						wv_tile512(oh + (size_t)x * d, ph + (size_t)x * p_stride,
							   p_stride, vh, kv_pos, qp, j0, j1, d,
							   e0 + 16 * c, 1, 1);
		}
	}
}

/* sh[j] = e^(sh[j] - m) for the visible keys (kv_pos[j] <= qp), sixteen
 * or eight at a time: vexp.h's bits at every width. */
__attribute__((target("avx512f")))
static void softmax_exp_512(float *sh, const int32_t *kv_pos, int32_t qp, int n, float m)
{
	const __m512i q = _mm512_set1_epi32(qp);
	const __m512 mv = _mm512_set1_ps(m);
	int j = 0;

	for (; j + 16 <= n; j += 16) {
		__mmask16 vis = _mm512_cmple_epi32_mask(_mm512_loadu_si512(kv_pos + j), q);

		if (vis)
			_mm512_mask_storeu_ps(sh + j, vis, vexp16(_mm512_sub_ps(
				_mm512_maskz_loadu_ps(vis, sh + j), mv)));
	}
	for (; j < n; j++)
		if (kv_pos[j] <= qp)
			sh[j] = vexp1(sh[j] - m);
}

__attribute__((target("avx2,fma")))
static void softmax_exp_256(float *sh, const int32_t *kv_pos, int32_t qp, int n, float m)
{
	const __m256i q = _mm256_set1_epi32(qp);
	const __m256 mv = _mm256_set1_ps(m);
	int j = 0;

	for (; j + 8 <= n; j += 8) {
		/* lanes of ones where kv_pos <= qp */
		__m256i vis = _mm256_xor_si256(_mm256_cmpgt_epi32(
			_mm256_loadu_si256((const __m256i *)(kv_pos + j)), q), _mm256_set1_epi32(-1));

		if (_mm256_testz_si256(vis, vis))
			continue;
		_mm256_maskstore_ps(sh + j, vis, vexp8(_mm256_sub_ps(_mm256_maskload_ps(sh + j, vis),
								     mv)));
	}
	for (; j < n; j++)
		if (kv_pos[j] <= qp)
			sh[j] = vexp1(sh[j] - m);
}

static void softmax_exp(float *sh, const int32_t *kv_pos, int32_t qp, int n, float m, int width)
{
	if (width == 16)
		softmax_exp_512(sh, kv_pos, qp, n, m);
	else if (width == 8)
		softmax_exp_256(sh, kv_pos, qp, n, m);
	else
		for (int j = 0; j < n; j++)
			if (kv_pos[j] <= qp)
				sh[j] = vexp1(sh[j] - m);
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
			float p = vexp1(dot(qv + (size_t)h * d, kj, d) * a->scale - max[h]);

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

/* sum[h] = the visible keys' e[h * stride + j] in key order, in double, for
 * the grp heads. Each head's sum is one chain of dependent adds; four
 * heads go side by side so their chains overlap (same sums, same order
 * each): one head after another, the chains' latency was a tenth of a
 * decode batch's attention on the build machine (issue #26). */
static void denominators(double *sum, const float *e, size_t stride, const int32_t *kv_pos,
			 int32_t qp, int n_kv, int grp)
{
	int h = 0;

	for (; h + 4 <= grp; h += 4) {
		const float *e0 = e + h * stride, *e1 = e0 + stride, *e2 = e1 + stride,
			    *e3 = e2 + stride;
		double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;

		for (int j = 0; j < n_kv; j++)
			if (kv_pos[j] <= qp) {
				s0 += e0[j];
				s1 += e1[j];
				s2 += e2[j];
				s3 += e3[j];
			}
		sum[h] = s0;
		sum[h + 1] = s1;
		sum[h + 2] = s2;
		sum[h + 3] = s3;
	}
	for (; h < grp; h++) {
		const float *eh = e + h * stride;
		double s = 0.0;

		for (int j = 0; j < n_kv; j++)
			if (kv_pos[j] <= qp)
				s += eh[j];
		sum[h] = s;
	}
}

__attribute__((target_clones("avx2", "default")))
static void attend_rows(const struct att_args *a, int i0, int i1, int g, float *scores)
{
	const int d = a->head_dim, grp = a->group, n_kv = a->n_kv, nr = i1 - i0;
	const float *kh = a->k + (size_t)g * a->kv_stride * d;
	const float *vh = a->v + (size_t)g * a->kv_stride * d;
	const int wide = d % 8 == 0 && a->avx2;
	/* the query's pairs live on the stack: at most PAIR_FLOATS of them */
	const int pairs = wide && a->avx512 && grp % 2 == 0 && grp * d <= PAIR_FLOATS;
	const int wide_v = a->avx512 && d % 16 == 0;
	float qpair[pairs ? grp * d : 1];
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

			if (pairs)
				pair_heads(qpair, qv, d, grp);
			for (int j = j0; j < j1; j++) {
				const float *kj = kh + (size_t)j * d;

				if (wide && j + 8 <= j1) {
					int e = 0;

					while (e < 8 && a->kv_pos[j + e] <= qp)
						e++;
					if (e == 8) {	/* eight visible keys */
						if (pairs)
							scores8_512(qpair, kj, d, grp, a->scale,
								    sc + j, (size_t)n_kv);
						else
							scores8_avx2(qv, kj, d, grp, a->scale,
								     sc + j, (size_t)n_kv);
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
		const float *sr = scores + (size_t)r * grp * n_kv;
		float *out = a->out + q_at(a, i0 + r, g);

		memset(out, 0, sizeof(float) * grp * d);
		if (!seen[r])
			continue;
		for (int h = 0; h < grp; h++)
			softmax_exp(scores + ((size_t)r * grp + h) * n_kv, a->kv_pos, qp, n_kv,
				    max[r * grp + h], a->vexp);
		denominators(sum + (size_t)r * grp, sr, (size_t)n_kv, a->kv_pos, qp, n_kv, grp);
	}
	for (int j0 = 0; j0 < n_kv; j0 += KEY_TILE) {	/* the weighted sums of V */
		const int j1 = n_kv - j0 < KEY_TILE ? n_kv : j0 + KEY_TILE;

		for (int r = 0; r < nr; r++) {
			const int32_t qp = a->q_pos[i0 + r];
			const float *sc = scores + (size_t)r * grp * n_kv;
			float *out = a->out + q_at(a, i0 + r, g);

			if (!seen[r])
				continue;
			if (wide_v) {
				weighted_v_512(out, sc, (size_t)n_kv, vh, a->kv_pos, qp, j0, j1, d,
					       grp);
				continue;
			}
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

/* ---- which instructions ----------------------------------------------
 * Chosen once per process, as the matmul's is: the best the CPU has, or
 * $KVMEM_ATTENTION's, or kvmem_attention_use()'s, so that tests run every
 * one the CPU has against the arithmetic spelled out (before, each call
 * asked the CPU and the environment, every layer of every step, and an
 * AVX-512 machine ran the AVX2 code only for shapes the other refused). */
static int isa_chosen = KVMEM_ISA_C;	/* a KVMEM_ISA_ level (isa.h) */
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

static int isa_supported(int isa)
{
	__builtin_cpu_init();
	switch (isa) {
	case KVMEM_ISA_AVX512:	/* scores8_512 takes DQ's 256-bit halves */
		return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512f") &&
		       __builtin_cpu_supports("avx512dq");
	case KVMEM_ISA_AVX2:
		return __builtin_cpu_supports("avx2");
	default:
		return 1;
	}
}

static void choose_isa(void)
{
	isa_chosen = kvmem_isa_best(isa_supported, "KVMEM_ATTENTION");
}

int kvmem_attention_use(const char *isa)
{
	pthread_once(&isa_once, choose_isa);
	return kvmem_isa_pick(isa_supported, isa, &isa_chosen);
}

const char *kvmem_attention_isa(void)
{
	pthread_once(&isa_once, choose_isa);
	return kvmem_isa_names[isa_chosen];
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
 * from which the kernels' pool, and from which OpenMP, runs its items.
 * The pool's floor is a lone decode step of the embedded model (8 heads of
 * 64) at 64 keys: its two KV heads then take both cores, 12-20% more
 * tokens/s alone in bench batch's rounds (views of 100-600 keys) on the
 * build machine than with the floor at 512 keys (benchmarks.md, "A lone
 * conversation's attention on both cores"). */
#define POOL_WORK (1 << 15)
#define OMP_WORK (1 << 22)

struct batch_args {
	float *out;
	const float *q;
	const kvmem_att_seq *seqs;
	const long *first;
	int n_seqs, n_heads, head_dim, group, max_kv;
	int rows;	/* the most queries an item takes (a decode batch's: 1) */
	float scale;
	int avx2, avx512, vexp;
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
		.avx2 = b->avx2, .avx512 = b->avx512, .vexp = b->vexp,
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

	pthread_once(&isa_once, choose_isa);
	const int avx2 = isa_chosen >= KVMEM_ISA_AVX2, avx512 = isa_chosen == KVMEM_ISA_AVX512;

	const struct batch_args ba = {
		.out = out, .q = q, .seqs = seqs, .first = first, .n_seqs = n_seqs,
		.n_heads = n_heads, .head_dim = head_dim, .group = group, .max_kv = max_kv,
		.rows = rows,
		.scale = scale, .avx2 = avx2, .avx512 = avx512, .vexp = vexp_width(),
	};

	/* A decode batch's items (a few hundred keys each, n_kv_heads a
	 * session: 16 for 8 sessions of the embedded model) go to the
	 * kernels' pool: each takes tens of microseconds, less than an
	 * OpenMP worker under passive waits takes to wake (at 2 threads such
	 * a step took the time of 1); so does a lone decode step past 64
	 * keys (one item a KV head). A shorter one stays on this thread.
	 * Large work (prefill chunks) keeps OpenMP, dynamic one item at a
	 * time: items differ in cost (views differ in length, a query sees
	 * more of its view than the one before it). */
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
