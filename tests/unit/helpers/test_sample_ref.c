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

int test_sample_qsort(const float *logits, int vocab, const kvmem_sampler *s, uint64_t *rng)
{
	int n = s->top_k > 0 && s->top_k < vocab ? s->top_k : vocab, pick;
	int *idx = malloc(sizeof(int) * (size_t)vocab);
	double *p = malloc(sizeof(double) * (size_t)vocab), top, sum = 0, u, cum = 0;

	if (!idx || !p) {
		free(idx);
		free(p);
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
		p[i] = kvmem_sample_weight(((double)logit_at(idx[i]) - top) / s->temperature);
		sum += p[i];
	}
	if (s->top_p > 0.0f && s->top_p < 1.0f) {
		double want = s->top_p * sum;
		int keep = 0;

		while (keep < n && cum < want)
			cum += p[keep++];
		n = keep > 0 ? keep : 1;
		sum = cum > 0.0 ? cum : p[0];
	}
	u = kvmem_rng_uniform(rng) * sum;
	pick = idx[n - 1];
	cum = 0;
	for (int i = 0; i < n; i++) {
		cum += p[i];
		if (u < cum) {
			pick = idx[i];
			break;
		}
	}
out:
	free(idx);
	free(p);
	return pick;
}
