// SPDX-License-Identifier: MIT
/*
 * Token sampling: greedy, or temperature with optional top-k and top-p
 * (nucleus) cuts, drawn from a seeded splitmix64 stream.
 *
 * Candidates are ordered by logit, highest first, ties broken by the lower
 * token id, so the order (and hence the draw) is a pure function of the
 * logits, the settings and the RNG state. A non-greedy draw consumes exactly
 * one RNG value; greedy consumes none.
 */
#include <errno.h>
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

uint64_t kvmem_mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint64_t kvmem_rng_seed(uint64_t seed)
{
	return kvmem_mix64(seed + KVMEM_GOLDEN_GAMMA);
}

uint64_t kvmem_rng_next(uint64_t *rng)
{
	return kvmem_mix64(*rng += KVMEM_GOLDEN_GAMMA);
}

double kvmem_rng_uniform(uint64_t *rng)
{
	return (double)(kvmem_rng_next(rng) >> 11) * 0x1p-53;
}

/* NaN logits never win and are never drawn. */
static float logit_at(const float *logits, int i)
{
	return isnan(logits[i]) ? -INFINITY : logits[i];
}

/*
 * The first of the highest logits; a NaN never wins (all NaN or -inf: 0).
 * Two passes of SSE2 (x86-64's baseline): the highest value, 16 lanes at
 * a time (maxps(x, m) is x > m ? x : m, so a NaN x leaves m), then the
 * first logit equal to it, 16 at a time. The same index as the running
 * best it replaces (which ends at the highest value, first reached at the
 * first index holding it; +0 and -0 compare equal either way), a branch
 * a logit that took 0.11 ms at Qwen3's 152K vocabulary on one core of
 * the build machine (0.04 ms now): every greedy draw pays it, one a
 * session on a batched decode step's critical path.
 */
static int argmax(const float *logits, int vocab)
{
	__m128 m[4];
	float lane[16], top = -INFINITY;
	int i = 0;

	for (int j = 0; j < 4; j++)
		m[j] = _mm_set1_ps(-INFINITY);
	for (; i + 16 <= vocab; i += 16)
		for (int j = 0; j < 4; j++)
			m[j] = _mm_max_ps(_mm_loadu_ps(logits + i + 4 * j), m[j]);
	for (int j = 0; j < 4; j++)
		_mm_storeu_ps(lane + 4 * j, m[j]);
	for (int j = 0; j < 16; j++)
		top = lane[j] > top ? lane[j] : top;
	for (int k = i; k < vocab; k++)
		top = logits[k] > top ? logits[k] : top;
	if (top == -INFINITY)
		return 0;
	for (i = 0; i + 16 <= vocab; i += 16) {
		const __m128 t = _mm_set1_ps(top);
		int hit = 0;

		for (int j = 0; j < 4; j++) {
			const __m128 x = _mm_loadu_ps(logits + i + 4 * j);

			hit |= _mm_movemask_ps(_mm_cmpeq_ps(x, t)) << 4 * j;
		}
		if (hit)
			return i + __builtin_ctz((unsigned)hit);
	}
	for (; i < vocab; i++)
		if (logits[i] == top)
			return i;
	return 0;
}

/*
 * argmax()'s index in about one pass, with the logits' check beside it:
 * -1 when one is NaN or infinite (*bad: the first such), which a session
 * refuses to draw from. A greedy draw was three passes over the logits (the
 * check, then argmax's two, SSE2): ~100 us a draw on one of the H100 host's
 * cores at Qwen3's 151,936 logits, and the draws of a batched decode step
 * were 6-11% of it there (issue #26). Here the highest value is found
 * chunk by chunk, each chunk checked as it goes (AVX-512 where the CPU has
 * it: a load, a max, a class test and a mask or for 16 logits; else SSE2,
 * as argmax), and the first chunk to reach the final highest is the only
 * one read again, for its first index: the highest value of a set does not
 * depend on the order it is read in (+0 and -0 compare equal, as argmax's
 * second pass has them), so the index is argmax()'s. 151,936 logits on the
 * build machine: 28.4 us (SSE2), 6.1 us (AVX-512).
 */
#define ARGMAX_CHUNK 1024

/* The highest of x[i0..i1) (NaN never wins; -inf if none); *odd set when
 * one is NaN or infinite. */
__attribute__((target("avx512f,avx512dq")))
static float chunk_max_512(const float *x, int i0, int i1, int *odd)
{
	__m512 m = _mm512_set1_ps(-INFINITY);
	__mmask16 o = 0;
	int i = i0;

	for (; i + 16 <= i1; i += 16) {
		const __m512 v = _mm512_loadu_ps(x + i);

		m = _mm512_max_ps(v, m);
		o |= _mm512_fpclass_ps_mask(v, 0x99);	/* QNaN, SNaN, +inf, -inf */
	}
	if (i < i1) {
		const __mmask16 k = (__mmask16)((1u << (i1 - i)) - 1);
		const __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, x + i);

		m = _mm512_max_ps(v, m);
		o |= _mm512_mask_fpclass_ps_mask(k, v, 0x99);
	}
	*odd |= o != 0;
	return _mm512_reduce_max_ps(m);
}

/* The same with SSE2 (maxps(x, m) is x > m ? x : m, so a NaN x leaves m). */
static float chunk_max_sse2(const float *x, int i0, int i1, int *odd)
{
	const __m128i exp_mask = _mm_set1_epi32(0x7f800000);
	__m128i o = _mm_setzero_si128();	/* lanes whose exponent is all ones */
	__m128 m[4];
	float lane[16], top = -INFINITY;
	int i = i0;

	for (int j = 0; j < 4; j++)
		m[j] = _mm_set1_ps(-INFINITY);
	for (; i + 16 <= i1; i += 16)
		for (int j = 0; j < 4; j++) {
			const __m128 v = _mm_loadu_ps(x + i + 4 * j);

			m[j] = _mm_max_ps(v, m[j]);
			o = _mm_or_si128(o, _mm_cmpeq_epi32(_mm_and_si128(_mm_castps_si128(v),
									  exp_mask), exp_mask));
		}
	for (int j = 0; j < 4; j++)
		_mm_storeu_ps(lane + 4 * j, m[j]);
	for (int j = 0; j < 16; j++)
		top = lane[j] > top ? lane[j] : top;
	for (; i < i1; i++) {
		*odd |= !isfinite(x[i]);
		top = x[i] > top ? x[i] : top;
	}
	*odd |= _mm_movemask_epi8(o) != 0;
	return top;
}

static int argmax_512 = -1;	/* -1: not chosen yet */

static int have_512(void)
{
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
}

int kvmem_argmax_use_avx512(int on)
{
	if (on && !have_512())
		return -ENOTSUP;
	argmax_512 = on != 0;
	return 0;
}

int kvmem_argmax_finite(const float *logits, int vocab, int *bad)
{
	float top = -INFINITY;
	int best = -1, odd = 0;	/* the first chunk to reach top; a bad logit seen */

	if (argmax_512 < 0)
		argmax_512 = have_512();
	*bad = -1;
	for (int c0 = 0; c0 < vocab; c0 += ARGMAX_CHUNK) {
		const int c1 = vocab - c0 < ARGMAX_CHUNK ? vocab : c0 + ARGMAX_CHUNK;
		const float cmax = argmax_512 ? chunk_max_512(logits, c0, c1, &odd)
					      : chunk_max_sse2(logits, c0, c1, &odd);

		if (best < 0 || cmax > top) {	/* ties keep the earlier chunk */
			top = cmax;
			best = c0 / ARGMAX_CHUNK;
		}
	}
	if (odd) {	/* rare: the first bad logit, one by one */
		for (int i = 0; i < vocab; i++)
			if (!isfinite(logits[i])) {
				*bad = i;
				break;
			}
		return -1;
	}
	if (vocab <= 0 || top == -INFINITY)
		return 0;
	for (int i = best * ARGMAX_CHUNK; i < vocab; i++)
		if (logits[i] == top)
			return i;
	return 0;
}

/* "a ranks before b": higher logit, then lower id. */
static int ranks_before(const float *logits, int a, int b)
{
	float la = logit_at(logits, a), lb = logit_at(logits, b);

	return la > lb || (la == lb && a < b);
}

/*
 * A logit's place in ranks_before's order as an unsigned key, the best
 * first: NaN as -inf, -0 as +0 (they compare equal), then the float's bits
 * made to order as unsigned (the sign flipped, negatives inverted) and
 * inverted so that the highest logit has the lowest key.
 */
static uint32_t rank_key_desc(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	if ((u & 0x7fffffffu) > 0x7f800000u)	/* NaN */
		u = 0xff800000u;
	if ((u & 0x7fffffffu) == 0)		/* -0 */
		u = 0;
	u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
	return ~u;
}

/*
 * Every id in rank order (ranks_before: higher logit first, ties to the
 * lower id): a stable LSD radix sort of the ids, ascending at the start,
 * on rank_key_desc, a byte a pass. It replaced qsort with ranks_before as
 * the comparison, whose 151,936 logits at Qwen3's vocabulary took 25 ms a
 * draw at a temperature with no top-k (issue #26: kvmem serve samples on
 * its engine thread); test_sample_full_order holds it to that qsort.
 */
static int rank_order(int *out, const float *logits, int vocab)
{
	uint32_t *ka = malloc(sizeof(uint32_t) * (size_t)vocab);
	uint32_t *kb = malloc(sizeof(uint32_t) * (size_t)vocab);
	int *tmp = malloc(sizeof(int) * (size_t)vocab);
	uint32_t *ks = ka, *kd = kb;
	int *is = out, *id = tmp;

	if (!ka || !kb || !tmp) {
		free(ka);
		free(kb);
		free(tmp);
		return -ENOMEM;
	}
	for (int i = 0; i < vocab; i++) {
		ka[i] = rank_key_desc(logits[i]);
		out[i] = i;
	}
	for (int shift = 0; shift < 32; shift += 8) {
		size_t at[256] = { 0 }, sum = 0;

		for (int i = 0; i < vocab; i++)
			at[(ks[i] >> shift) & 255]++;
		if (at[(ks[0] >> shift) & 255] == (size_t)vocab)
			continue;	/* one bucket: the order stands */
		for (int b = 0; b < 256; b++) {
			const size_t c = at[b];

			at[b] = sum;
			sum += c;
		}
		for (int i = 0; i < vocab; i++) {
			const size_t p = at[(ks[i] >> shift) & 255]++;

			kd[p] = ks[i];
			id[p] = is[i];
		}
		uint32_t *kt = ks;
		int *it = is;

		ks = kd;
		kd = kt;
		is = id;
		id = it;
	}
	if (is != out)
		memcpy(out, is, sizeof(int) * (size_t)vocab);
	free(ka);
	free(kb);
	free(tmp);
	return 0;
}

/* Keep the k best ids in idx[0..k-1], best first (a bounded insertion
 * into a sorted array: fine for the k values sampling uses). */
static int select_top_k(int *idx, const float *logits, int vocab, int k)
{
	int have = 0;

	for (int i = 0; i < vocab; i++) {
		if (have == k && !ranks_before(logits, i, idx[k - 1]))
			continue;
		int at = have < k ? have++ : k - 1;

		while (at > 0 && ranks_before(logits, i, idx[at - 1])) {
			idx[at] = idx[at - 1];
			at--;
		}
		idx[at] = i;
	}
	return have;
}

int kvmem_sample(const float *logits, int vocab, const kvmem_sampler *s, uint64_t *rng)
{
	if (vocab <= 0)
		return -EINVAL;
	if (s->temperature <= 0.0f)
		return argmax(logits, vocab);

	int k = (s->top_k > 0 && s->top_k < vocab) ? s->top_k : vocab;
	int *idx = malloc(sizeof(int) * k);
	double *p = malloc(sizeof(double) * k);

	if (!idx || !p) {
		free(idx);
		free(p);
		return -ENOMEM;
	}
	int n;

	if (k < vocab && k <= 1024) {
		n = select_top_k(idx, logits, vocab, k);
	} else {
		int *all = k == vocab ? idx : malloc(sizeof(int) * vocab);

		if (!all) {
			free(idx);
			free(p);
			return -ENOMEM;
		}
		if (rank_order(all, logits, vocab)) {
			if (all != idx)
				free(all);
			free(idx);
			free(p);
			return -ENOMEM;
		}
		if (all != idx) {
			for (int i = 0; i < k; i++)
				idx[i] = all[i];
			free(all);
		}
		n = k;
	}

	/* Softmax over the kept candidates at temperature T, in double. */
	double top = logit_at(logits, idx[0]), sum = 0.0;

	if (!isfinite(top)) {	/* an inf logit wins outright; all -inf: the first */
		int pick = idx[0];

		free(idx);
		free(p);
		return pick;
	}

	for (int i = 0; i < n; i++) {
		p[i] = exp(((double)logit_at(logits, idx[i]) - top) / s->temperature);
		sum += p[i];
	}
	/* Nucleus: the shortest prefix whose mass reaches top_p. */
	if (s->top_p > 0.0f && s->top_p < 1.0f) {
		double want = s->top_p * sum, cum = 0.0;
		int keep = 0;

		while (keep < n && cum < want)
			cum += p[keep++];
		n = keep > 0 ? keep : 1;
		sum = cum > 0.0 ? cum : p[0];
	}

	double u = kvmem_rng_uniform(rng) * sum, cum = 0.0;
	int pick = idx[n - 1];

	for (int i = 0; i < n; i++) {
		cum += p[i];
		if (u < cum) {
			pick = idx[i];
			break;
		}
	}
	free(idx);
	free(p);
	return pick;
}
