// SPDX-License-Identifier: MIT
/*
 * What a draw at a temperature costs over Qwen3's 151,936 logits on this
 * CPU: kvmem_sample (its full rank order by a radix sort on rank keys) beside
 * the qsort it replaced (ids by ranks_before's rule, then the same softmax and
 * draw), in the same run, on the same logits; the draws must agree.
 * kvmem serve samples on its engine thread, a draw a running stream a round
 * (issue #26).
 *
 *   make && gcc -std=c11 -O2 -Iinclude -o /tmp/sample_cost tools/bench/sample_cost.c \
 *       build/libkvmem.a $(pkg-config --libs liburing numa libxxhash libpcre2-8 jansson) \
 *       -lopenblas -lunistring -lm -lpthread -fopenmp && /tmp/sample_cost [DRAWS]
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kvmem/sample.h"

#define VOCAB 151936

static const float *g_l;

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float at(int i)
{
	return isnan(g_l[i]) ? -INFINITY : g_l[i];
}

static int by_rank(const void *pa, const void *pb)
{
	int a = *(const int *)pa, b = *(const int *)pb;

	if (a == b)
		return 0;
	return at(a) > at(b) || (at(a) == at(b) && a < b) ? -1 : 1;
}

/* The qsort path, as kvmem_sample ran it before 2026-12-06. */
static int sample_qsort(const float *l, const kvmem_sampler *s, uint64_t *rng)
{
	int *idx = malloc(sizeof(int) * VOCAB), n = s->top_k > 0 && s->top_k < VOCAB ? s->top_k : VOCAB;
	double *p = malloc(sizeof(double) * VOCAB), top, sum = 0, u, cum = 0;
	int pick;

	for (int i = 0; i < VOCAB; i++)
		idx[i] = i;
	g_l = l;
	qsort(idx, VOCAB, sizeof(int), by_rank);
	top = at(idx[0]);
	for (int i = 0; i < n; i++) {
		p[i] = exp(((double)at(idx[i]) - top) / s->temperature);
		sum += p[i];
	}
	if (s->top_p > 0.0f && s->top_p < 1.0f) {
		double want = s->top_p * sum;
		int keep = 0;

		for (cum = 0; keep < n && cum < want;)
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
	free(idx);
	free(p);
	return pick;
}

int main(int argc, char **argv)
{
	const int draws = argc > 1 ? atoi(argv[1]) : 20;
	static const kvmem_sampler cfg[] = {
		{ .temperature = 1.0f }, { .temperature = 0.7f, .top_p = 0.9f },
		{ .temperature = 1.0f, .top_k = 2000 },
	};
	float *l = malloc(sizeof(float) * VOCAB);
	uint64_t r = 1;

	if (!l || draws < 1)
		return 1;
	for (int i = 0; i < VOCAB; i++) {	/* logits of a model's spread, with ties */
		r = r * 6364136223846793005ull + 1442695040888963407ull;
		l[i] = (float)((int)(r >> 44) % 20000) / 1000.0f - 10.0f;
	}
	printf("sample_cost: %d logits, %d draws a configuration\n", VOCAB, draws);
	printf("%-26s %14s %14s %8s %s\n", "sampler", "qsort us", "kvmem_sample us", "ratio", "same");
	for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
		uint64_t a = kvmem_rng_seed(7), b = a;
		double tq = 0, tk = 0, t0;
		int same = 1;

		for (int d = 0; d < draws; d++) {
			int x, y;

			t0 = now_s();
			x = sample_qsort(l, &cfg[c], &a);
			tq += now_s() - t0;
			t0 = now_s();
			y = kvmem_sample(l, VOCAB, &cfg[c], &b);
			tk += now_s() - t0;
			same &= x == y && a == b;
		}
		printf("T %.1f top_k %-5d top_p %.2f %14.1f %14.1f %7.2fx %s\n", cfg[c].temperature,
		       cfg[c].top_k, cfg[c].top_p, tq / draws * 1e6, tk / draws * 1e6, tq / tk,
		       same ? "yes" : "NO");
		if (!same)
			return 1;
	}
	free(l);
	return 0;
}
