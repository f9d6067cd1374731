// SPDX-License-Identifier: MIT
#include <math.h>
#include <stdlib.h>

#include "kernels/kernels.h"
#include "test_sample_ref.h"

static const float *g_logits;

static float logit_at(int i)
{
	return isnan(g_logits[i]) ? -INFINITY : g_logits[i];
}

static int by_rank(const void *pa, const void *pb)
{
	int a = *(const int *)pa, b = *(const int *)pb;
	float la = logit_at(a), lb = logit_at(b);

	if (a == b)
		return 0;
	return la > lb || (la == lb && a < b) ? -1 : 1;
}

/*
 * The draw as kernels/draw_fixed.h defines it, written again: the whole
 * rank order by qsort, each weight trunc(e^x 2^52) of the scalar e^x, and
 * the sums in the compiler's unsigned __int128 (not draw_fixed.h's pairs).
 */
int test_sample_qsort(const float *logits, int vocab, const kvmem_sampler *s, uint64_t *rng)
{
	typedef unsigned __int128 u128;
	int n = s->top_k > 0 && s->top_k < vocab ? s->top_k : vocab, pick;
	int *idx = malloc(sizeof(int) * (size_t)vocab);
	uint64_t *w = malloc(sizeof(uint64_t) * (size_t)vocab), u53;
	double top;
	u128 sum = 0, cum = 0, t;

	if (!idx || !w) {
		free(idx);
		free(w);
		return -1;
	}
	for (int i = 0; i < vocab; i++)
		idx[i] = i;
	g_logits = logits;
	qsort(idx, (size_t)vocab, sizeof(int), by_rank);
	top = logit_at(idx[0]);
	if (!isfinite(top)) {	/* an inf logit wins outright; all -inf: the first */
		pick = idx[0];
		goto out;
	}
	for (int i = 0; i < n; i++) {
		const double x = ((double)logit_at(idx[i]) - top) / s->temperature;

		w[i] = (uint64_t)(kvmem_sample_weight(x) * 0x1p52);
		sum += w[i];
	}
	if (s->top_p > 0.0f && s->top_p < 1.0f) {
		const u128 bar = (sum * (uint64_t)((double)s->top_p * 0x1p32)) >> 32;
		int keep = 0;

		do
			cum += w[keep++];
		while (keep < n && cum < bar);
		n = keep;
		sum = cum;
		cum = 0;
	}
	u53 = kvmem_rng_next(rng) >> 11;
	t = (sum * u53) >> 53;
	pick = idx[n - 1];
	for (int i = 0; i < n; i++) {
		cum += w[i];
		if (t < cum) {
			pick = idx[i];
			break;
		}
	}
out:
	free(idx);
	free(w);
	return pick;
}
