/* SPDX-License-Identifier: MIT */
/*
 * A draw at a temperature, in integers: one definition for the CPU
 * (kernels/cpu/sample.c, kvmem_sample) and the GPU (kernels/cuda/sample.cu,
 * the rows of a batched step), so that both give a token bit for bit.
 *
 * A candidate's weight is e^x, x = (logit - best) / T in double (kvmem's
 * own e^x below: the same IEEE operations on both sides), as a fixed-point
 * integer W = trunc(e^x 2^52): the best candidate weighs exactly 2^52, one
 * whose x is below about -36 weighs 0 and is never drawn. Sums of W are
 * exact, so they are the same in any order: the GPU adds a row's weights
 * over a thousand threads and the CPU in one loop, and neither depends on
 * the other's order. (Before 2026-12-06 the weights were doubles summed in
 * rank order, which a parallel sum cannot reproduce; issue #26.)
 *
 * Over n candidates in rank order (best first) with weights W_0..W_n-1 and
 * their prefix sums C_r = W_0 + .. + W_r (C_n-1 = S):
 *   top-p    with 0 < top_p < 1: P = (S q) >> 32, q = trunc(top_p 2^32);
 *            the kept prefix ends at the first r with C_r >= P; S is then C_r
 *   draw     u = the random stream's next 64 bits >> 11 (53 bits), one value
 *            a draw; t = (S u) >> 53 < S; the token is the first r with
 *            C_r > t.
 * S stays under 2^75 for a vocabulary of up to 2^23 (KVMEM_DRAW_VOCAB_MAX),
 * so S u fits in 128 bits.
 */
#ifndef KVMEM_KERNELS_DRAW_FIXED_H
#define KVMEM_KERNELS_DRAW_FIXED_H

#include <stdint.h>

#include <math.h>
#include <string.h>

#ifdef __CUDACC__
#define DRAW_HD static __host__ __device__ __forceinline__
#else
#define DRAW_HD static inline
#endif

#define KVMEM_DRAW_VOCAB_MAX (1 << 23)
/* x at or below this weighs 0 whatever e^x rounds to (e^-38 2^52 = 0.14):
 * a skip, not a rule. */
#define KVMEM_DRAW_CUT (-38.0)
/* Ids a device draw leaves out (a benchmark's ignore_eos: the stops). */
#define KVMEM_DRAW_BANNED_MAX 16

/* What a device draw of one row needs (kvmem_fwd_item.draw). */
typedef struct kvmem_draw_spec {
	float temperature;	/* > 0 */
	float top_p;		/* >= 1 or <= 0: no nucleus cut */
	int top_k;		/* <= 0: no top-k cut */
	int n_banned;		/* 0..KVMEM_DRAW_BANNED_MAX */
	uint64_t rng;		/* the random state before the draw */
	int32_t banned[KVMEM_DRAW_BANNED_MAX];	/* drawn as if their logits were -inf */
} kvmem_draw_spec;

/* Whether a draw's top-k is 1024 or less (the GPU selects those in one
 * block; a draw with none or a larger one sorts the keys that can weigh). */
DRAW_HD int kvmem_draw_top_k_small(int top_k, int vocab)
{
	return top_k > 0 && top_k < vocab && top_k <= 1024;
}

/* ---- e^x in double (wexp.h's polynomial, the scalar reference) ---------- */
#define WEXP_LO (-745.2)
#define WEXP_LOG2E 1.4426950408889634
#define WEXP_LN2_HI 6.93147180369123816490e-01	/* 0x3fe62e42fee00000 */
#define WEXP_LN2_LO 1.90821492927058770002e-10	/* ln 2 - WEXP_LN2_HI */
#define WEXP_BIAS 1087	/* 1023 + 64 */
#define WEXP_C13 1.6059043836821613e-10	/* 1/13!, Horner's start */
/* Then 1/j! for j = 12 .. 2, and 1, 1: p = p r + c for each c in turn. */
#define WEXP_COEFFS                                                                             \
	2.08767569878681e-09, 2.505210838544172e-08, 2.755731922398589e-07,                     \
		2.7557319223985893e-06, 2.48015873015873e-05, 0.0001984126984126984,            \
		0.001388888888888889, 0.008333333333333333, 0.041666666666666664,               \
		0.16666666666666666, 0.5, 1.0, 1.0

/* nvcc's device pass (__CUDA_ARCH__) and every host compiler: the same
 * correctly rounded operations, none contracted. */
#ifdef __CUDA_ARCH__
#define DRAW_FMA(a, b, c) __fma_rn(a, b, c)
#define DRAW_MUL(a, b) __dmul_rn(a, b)
#define DRAW_RINT(x) rint(x)	/* to nearest, ties to even: nearbyint's default mode */
#else
#define DRAW_FMA(a, b, c) fma(a, b, c)
#define DRAW_MUL(a, b) ((a) * (b))
#define DRAW_RINT(x) nearbyint(x)
#endif

/* e^x, x <= 0, within 2 ulp (test_sample_weight); 0 below WEXP_LO or NaN.
 * x = k ln2 + r, k = round(x log2 e), a degree-13 polynomial for e^r, then
 * 2^k in two exact steps so that a subnormal result rounds once. */
DRAW_HD double kvmem_draw_exp(double x)
{
	const double c[13] = { WEXP_COEFFS };
	double k, r, p, s;
	uint64_t e;

	if (!(x >= WEXP_LO))
		return 0.0;
	k = DRAW_RINT(DRAW_MUL(x, WEXP_LOG2E));
	r = DRAW_FMA(-k, WEXP_LN2_HI, x);
	r = DRAW_FMA(-k, WEXP_LN2_LO, r);
	p = WEXP_C13;
	for (int j = 0; j < 13; j++)
		p = DRAW_FMA(p, r, c[j]);
	e = (uint64_t)((int64_t)k + WEXP_BIAS) << 52;
#ifdef __CUDA_ARCH__
	s = __longlong_as_double((long long)e);
#else
	memcpy(&s, &e, sizeof(s));
#endif
	return DRAW_MUL(DRAW_MUL(p, s), 0x1p-64);	/* (p 2^(k+64)) 2^-64 */
}

/* x = (logit - top) / T, as both sides compute it. */
DRAW_HD double kvmem_draw_x(float logit, double top, float temperature)
{
#ifdef __CUDA_ARCH__
	return __ddiv_rn(__dsub_rn((double)logit, top), (double)temperature);
#else
	return ((double)logit - top) / (double)temperature;
#endif
}

/* e^x as a draw's weight: trunc(e^x 2^52). */
DRAW_HD uint64_t kvmem_draw_fix(double ex)
{
	return (uint64_t)DRAW_MUL(ex, 0x1p52);
}

/* A candidate's weight from its x. */
DRAW_HD uint64_t kvmem_draw_weight_of(double x)
{
	return x > KVMEM_DRAW_CUT ? kvmem_draw_fix(kvmem_draw_exp(x)) : 0;
}

/* ---- 128-bit sums ------------------------------------------------------- */
typedef struct kvmem_u128 {
	uint64_t lo, hi;
} kvmem_u128;

DRAW_HD kvmem_u128 kvmem_u128_add64(kvmem_u128 a, uint64_t b)
{
	a.lo += b;
	a.hi += a.lo < b;
	return a;
}

DRAW_HD kvmem_u128 kvmem_u128_add(kvmem_u128 a, kvmem_u128 b)
{
	a.lo += b.lo;
	a.hi += b.hi + (a.lo < b.lo);
	return a;
}

DRAW_HD int kvmem_u128_lt(kvmem_u128 a, kvmem_u128 b)
{
	return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo);
}

/* The low 128 bits of a b. */
DRAW_HD kvmem_u128 kvmem_u128_mul64(kvmem_u128 a, uint64_t b)
{
	kvmem_u128 r;

#ifdef __CUDA_ARCH__
	r.hi = __umul64hi(a.lo, b) + a.hi * b;
#else
	r.hi = (uint64_t)(((unsigned __int128)a.lo * b) >> 64) + a.hi * b;
#endif
	r.lo = a.lo * b;
	return r;
}

/* a >> s, 0 < s < 64. */
DRAW_HD kvmem_u128 kvmem_u128_shr(kvmem_u128 a, int s)
{
	kvmem_u128 r = { (a.lo >> s) | (a.hi << (64 - s)), a.hi >> s };

	return r;
}

/* top_p as the share q of 2^32 (0 < top_p < 1). */
DRAW_HD uint64_t kvmem_draw_share(float top_p)
{
	return (uint64_t)DRAW_MUL((double)top_p, 0x1p32);
}

/* The nucleus's bar P, S the kept candidates' sum. */
DRAW_HD kvmem_u128 kvmem_draw_bar(kvmem_u128 s, float top_p)
{
	return kvmem_u128_shr(kvmem_u128_mul64(s, kvmem_draw_share(top_p)), 32);
}

/* The draw's target t = (S u) >> 53. */
DRAW_HD kvmem_u128 kvmem_draw_target(kvmem_u128 s, uint64_t u53)
{
	return kvmem_u128_shr(kvmem_u128_mul64(s, u53), 53);
}

/* Whether a top-p cut applies. */
DRAW_HD int kvmem_draw_has_top_p(float top_p)
{
	return top_p > 0.0f && top_p < 1.0f;
}

/* The place the draw lands on among n >= 1 weights in rank order (W_0 > 0),
 * u53 the draw's 53 random bits: the reference the GPU's parallel form
 * matches. */
DRAW_HD int kvmem_draw_place(const uint64_t *w, int n, float top_p, uint64_t u53)
{
	kvmem_u128 s = { 0, 0 }, c = { 0, 0 }, t;
	int at;

	for (int i = 0; i < n; i++)
		s = kvmem_u128_add64(s, w[i]);
	if (kvmem_draw_has_top_p(top_p)) {
		const kvmem_u128 bar = kvmem_draw_bar(s, top_p);
		int keep = 0;

		while (keep < n) {
			c = kvmem_u128_add64(c, w[keep++]);
			if (!kvmem_u128_lt(c, bar))
				break;
		}
		n = keep;
		s = c;
		c.lo = c.hi = 0;
	}
	t = kvmem_draw_target(s, u53);
	for (at = 0; at < n; at++) {
		c = kvmem_u128_add64(c, w[at]);
		if (kvmem_u128_lt(t, c))
			return at;
	}
	return n - 1;	/* not reached: t < S */
}

#endif
