// SPDX-License-Identifier: MIT
/*
 * Token sampling: greedy, or temperature with optional top-k and top-p
 * (nucleus) cuts, drawn from a seeded splitmix64 stream.
 *
 * Candidates are ordered by logit, highest first, ties broken by the lower
 * token id, so the order (and hence the draw) is a pure function of the
 * logits, the settings and the RNG state. A non-greedy draw consumes exactly
 * one RNG value; greedy consumes none. A draw's weights and sums are the
 * integers of kernels/draw_fixed.h, so the GPU's rows of a batched step
 * (kernels/cuda/sample.cu) draw the same token from the same state.
 */
#include <errno.h>
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/cpu/wexp.h"

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

/* The logit a rank key stands for: the logit itself, but -inf for a NaN
 * and +0 for -0, which weigh the same in the draw as logit_at's. */
static float key_logit(uint32_t k)
{
	uint32_t u = ~k;
	float f;

	u = (u & 0x80000000u) ? (u & 0x7fffffffu) : ~u;
	memcpy(&f, &u, sizeof(f));
	return f;
}

/*
 * A thread's buffers for its draws, kept between them and grown as a
 * vocabulary asks (freed when the thread ends). A draw over 151,936 logits
 * needs 2.4 MB (the top-k path's ids and weights are touched only as far
 * as k); allocated and freed a draw, glibc mmapped and unmapped them
 * each time: page faults to touch them again, and an munmap stops every
 * other thread of the process for its TLB, while kvmem serve makes a
 * round's draws side by side on OpenMP's threads (issue #26).
 */
struct scratch {
	int cap;		/* entries each array holds */
	uint32_t *ka, *kb;	/* rank keys, the sort's two sides */
	int *idx;		/* top-k: the kept ids */
	double *p;		/* x, then e^x, of the kept ids (the whole order's: all k) */
	uint64_t *w;		/* their weights (kernels/draw_fixed.h) */
};

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_key_ok;

static void scratch_free(void *arg)
{
	struct scratch *w = arg;

	if (!w)
		return;
	free(w->ka);
	free(w->kb);
	free(w->idx);
	free(w->p);
	free(w->w);
	free(w);
}

static void scratch_key_make(void)
{
	scratch_key_ok = pthread_key_create(&scratch_key, scratch_free) == 0;
}

/* *p made `bytes` long; left as it was when memory runs out. */
static int grow(void **p, size_t bytes)
{
	void *q = realloc(*p, bytes);

	if (!q)
		return -1;
	*p = q;
	return 0;
}

/* The calling thread's buffers, room for n entries each; NULL when memory
 * (or a thread key) runs out. */
static struct scratch *scratch_get(int n)
{
	struct scratch *w;

	pthread_once(&scratch_once, scratch_key_make);
	if (!scratch_key_ok)
		return NULL;
	w = pthread_getspecific(scratch_key);
	if (!w) {
		if (!(w = calloc(1, sizeof(*w))))
			return NULL;
		if (pthread_setspecific(scratch_key, w)) {
			free(w);
			return NULL;
		}
	}
	if (w->cap < n) {
		const size_t i4 = sizeof(int) * (size_t)n, u4 = sizeof(uint32_t) * (size_t)n;

		if (grow((void **)&w->ka, u4) || grow((void **)&w->kb, u4) || grow((void **)&w->idx, i4) ||
		    grow((void **)&w->p, sizeof(double) * (size_t)n) ||
		    grow((void **)&w->w, sizeof(uint64_t) * (size_t)n))
			return NULL;	/* what grew stays, for the next call */
		w->cap = n;
	}
	return w;
}

/*
 * Rank keys in rank order (best first; ties need no order: their keys are
 * equal): an LSD radix sort of the m keys at src alone, three passes of 11
 * bits, their counts taken in one read before them; tmp is the other side.
 * Returns the sorted array (src or tmp).
 *
 * The draw below needs the ids of only the one key it lands on, which a
 * pass over the logits finds. The first radix sort here moved each key
 * with its id (25 ms a draw with qsort before it, 4.2 ms with a radix sort
 * of key and id, both with each draw's buffers allocated anew): kvmem serve
 * makes a round's draws side by side, each thread on its own buffers, and
 * 16 streams' draws were then memory-bound together (issue #26).
 */
#define RADIX_BITS 11
#define RADIX_PASSES 3	/* 33 bits: the 32 of a key */

static uint32_t *sort_keys(uint32_t *src, uint32_t *tmp, int m)
{
	static const int R = 1 << RADIX_BITS;
	uint32_t count[RADIX_PASSES][1 << RADIX_BITS], *dst = tmp;

	memset(count, 0, sizeof(count));
	for (int i = 0; i < m; i++)
		for (int d = 0; d < RADIX_PASSES; d++)
			count[d][(src[i] >> (RADIX_BITS * d)) & (R - 1)]++;
	for (int d = 0; d < RADIX_PASSES && m > 0; d++) {
		const int shift = RADIX_BITS * d;
		uint32_t *at = count[d], sum = 0;

		if (at[(src[0] >> shift) & (R - 1)] == (uint32_t)m)
			continue;	/* one bucket: the order stands */
		for (int b = 0; b < R; b++) {
			const uint32_t c = at[b];

			at[b] = sum;
			sum += c;
		}
		for (int i = 0; i < m; i++)
			dst[at[(src[i] >> shift) & (R - 1)]++] = src[i];

		uint32_t *t = src;

		src = dst;
		dst = t;
	}
	return src;
}

/* The id at place `at` of the rank order, keys[] that order's keys: of the
 * ids whose key is keys[at], ascending, the one as far in as `at` is past
 * the key's first place. */
static int id_at(const uint32_t *keys, int at, const float *logits, int vocab)
{
	const uint32_t key = keys[at];
	int first = at, i;

	while (first > 0 && keys[first - 1] == key)
		first--;
	for (i = 0; i < vocab; i++)
		if (rank_key_desc(logits[i]) == key && first++ == at)
			return i;
	return 0;	/* not reached: the key came from these logits */
}

double kvmem_sample_weight(double x)
{
	return wexp1(x);
}

/* 8, 4 or 1; 0: not chosen yet (the first draws of several threads may
 * choose it at once: the same answer) */
static _Atomic int wexp_width;

int kvmem_sample_weight_use(int width)
{
	__builtin_cpu_init();
	if (width != 8 && width != 4 && width != 1)
		return -EINVAL;
	if ((width == 8 && !have_512()) ||
	    (width == 4 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))))
		return -ENOTSUP;
	atomic_store_explicit(&wexp_width, width, memory_order_relaxed);
	return 0;
}

__attribute__((target("avx512f,avx512dq"))) static void weights8(double *p, int n)
{
	int i = 0;

	for (; i + 8 <= n; i += 8)
		_mm512_storeu_pd(p + i, wexp8(_mm512_loadu_pd(p + i)));
	for (; i < n; i++)
		p[i] = wexp1(p[i]);
}

__attribute__((target("avx2,fma"))) static void weights4(double *p, int n)
{
	int i = 0;

	for (; i + 4 <= n; i += 4)
		_mm256_storeu_pd(p + i, wexp4(_mm256_loadu_pd(p + i)));
	for (; i < n; i++)
		p[i] = wexp1(p[i]);
}

/* p[i] = e^p[i] for i < n, at the widest width this CPU has (the bits are
 * the same at every width). */
void kvmem_sample_weights(double *p, int n)
{
	int width = atomic_load_explicit(&wexp_width, memory_order_relaxed);

	if (!width) {
		if (kvmem_sample_weight_use(8) && kvmem_sample_weight_use(4))
			kvmem_sample_weight_use(1);
		width = atomic_load_explicit(&wexp_width, memory_order_relaxed);
	}
	if (width == 8)
		weights8(p, n);
	else if (width == 4)
		weights4(p, n);
	else
		for (int i = 0; i < n; i++)
			p[i] = wexp1(p[i]);
}

/* The draw's 53 random bits: one value of the stream. */
static uint64_t draw_bits(uint64_t *rng)
{
	return kvmem_rng_next(rng) >> 11;
}

/*
 * The draw over the first n of the rank order, whose keys are at keys (n
 * at most the keys there): the place it lands on. The weights' e^x come
 * from one vectorised pass (wexp.h: the bits of kernels/draw_fixed.h's
 * scalar form), their sums are integers (draw_fixed.h).
 */
static int draw_over(const uint32_t *keys, int n, const kvmem_sampler *s, double top,
		     uint64_t u53, struct scratch *w)
{
	for (int i = 0; i < n; i++)
		w->p[i] = kvmem_draw_x(key_logit(keys[i]), top, s->temperature);
	kvmem_sample_weights(w->p, n);
	for (int i = 0; i < n; i++)
		w->w[i] = kvmem_draw_fix(w->p[i]);
	return kvmem_draw_place(w->w, n, s->top_p, u53);
}

/*
 * The draw over the k best of the whole order (k past 1024 or all). A
 * candidate whose x is at or below KVMEM_DRAW_CUT weighs 0 (draw_fixed.h)
 * and is never drawn nor counted, and the weights fall along the order: so
 * only the candidates whose logits are at least top + KVMEM_DRAW_CUT T are
 * sorted and weighed, which at a low temperature or over a peaked
 * distribution is a small part of 151,936 logits. The draw is the same
 * token, bit for bit, as over the whole order (test_sample_full_order's
 * qsort twin).
 */
static int draw_ranked(const float *logits, int vocab, int k, const kvmem_sampler *s,
		       uint64_t *rng, struct scratch *w)
{
	uint32_t best = UINT32_MAX, kc = UINT32_MAX, *keys;
	double top, cf;
	uint64_t u53;
	int m = 0, at, i;

	for (i = 0; i < vocab; i++) {
		w->ka[i] = rank_key_desc(logits[i]);
		best = w->ka[i] < best ? w->ka[i] : best;
	}
	top = key_logit(best);
	if (!isfinite(top)) {	/* an inf logit wins outright; all -inf: the first */
		for (i = 0; i < vocab && w->ka[i] != best; i++)
			;
		return i < vocab ? i : 0;
	}
	u53 = draw_bits(rng);
	cf = top + KVMEM_DRAW_CUT * s->temperature;
	if (cf > -FLT_MAX) {	/* keys at most the cut's: logits at least cf */
		float f = (float)cf;

		if ((double)f > cf)
			f = nextafterf(f, -INFINITY);
		kc = rank_key_desc(f);
	}
	for (i = 0; i < vocab; i++)
		if (w->ka[i] <= kc)
			w->kb[m++] = w->ka[i];
	keys = sort_keys(w->kb, w->ka, m);
	at = draw_over(keys, k < m ? k : m, s, top, u53, w);
	return id_at(keys, at, logits, vocab);
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
	if (vocab > KVMEM_DRAW_VOCAB_MAX)	/* the integer sums' bound */
		return -EINVAL;

	int k = (s->top_k > 0 && s->top_k < vocab) ? s->top_k : vocab;
	struct scratch *w = scratch_get(vocab);
	int n, *idx;
	double top;

	if (!w)
		return -ENOMEM;
	if (k == vocab || k > 1024)
		return draw_ranked(logits, vocab, k, s, rng, w);
	idx = w->idx;
	n = select_top_k(idx, logits, vocab, k);
	top = logit_at(logits, idx[0]);
	if (!isfinite(top))	/* an inf logit wins outright; all -inf: the first */
		return idx[0];
	for (int i = 0; i < n; i++)
		w->w[i] = kvmem_draw_weight_of(kvmem_draw_x(logit_at(logits, idx[i]), top,
							    s->temperature));
	return idx[kvmem_draw_place(w->w, n, s->top_p, draw_bits(rng))];
}

int kvmem_sample_without(float *logits, int vocab, const kvmem_sampler *s, uint64_t *rng,
			 const int32_t *banned, int n_banned)
{
	float keep[KVMEM_DRAW_BANNED_MAX];
	int tok, n = 0;

	if (n_banned > KVMEM_DRAW_BANNED_MAX) {	/* rare: many stops; a copy */
		float *m = malloc(sizeof(float) * (size_t)vocab);

		if (!m)
			return -ENOMEM;
		memcpy(m, logits, sizeof(float) * (size_t)vocab);
		for (int i = 0; i < n_banned; i++)
			if (banned[i] >= 0 && banned[i] < vocab)
				m[banned[i]] = -INFINITY;
		tok = kvmem_sample(m, vocab, s, rng);
		free(m);
		return tok;
	}
	for (int i = 0; i < n_banned; i++)
		if (banned[i] >= 0 && banned[i] < vocab) {
			keep[n++] = logits[banned[i]];
			logits[banned[i]] = -INFINITY;
		}
	tok = kvmem_sample(logits, vocab, s, rng);
	for (int i = n_banned - 1; i >= 0; i--)	/* last first: a repeated id ends as it was */
		if (banned[i] >= 0 && banned[i] < vocab)
			logits[banned[i]] = keep[--n];
	return tok;
}

int kvmem_sample_spec(float *logits, int vocab, const kvmem_draw_spec *d)
{
	const kvmem_sampler s = { .temperature = d->temperature, .top_k = d->top_k,
				  .top_p = d->top_p };
	uint64_t rng = d->rng;
	int bad, n = d->n_banned < KVMEM_DRAW_BANNED_MAX ? d->n_banned : KVMEM_DRAW_BANNED_MAX;
	int tok;

	if (kvmem_argmax_finite(logits, vocab, &bad) < 0)
		return -1;
	tok = kvmem_sample_without(logits, vocab, &s, &rng, d->banned, n);
	if (tok < 0 || logits[tok] == -INFINITY)	/* every one -inf or banned: the first */
		return -1;
	for (int i = 0; i < n; i++)
		if (d->banned[i] == tok)
			return -1;
	return tok;
}
