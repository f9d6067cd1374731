// SPDX-License-Identifier: MIT
/*
 * What a draw at a temperature costs over Qwen3's 151,936 logits on this
 * CPU: kvmem_sample (its full rank order by a radix sort on rank keys) beside
 * the qsort it replaced (ids by ranks_before's rule, then the same softmax and
 * draw), in the same run, on the same logits; the draws must agree.
 * kvmem serve samples on its engine thread, a draw a running stream a round
 * (issue #26).
 *
 *   make && gcc -std=c11 -O2 -Iinclude -Itests/unit/helpers -o /tmp/sample_cost \
 *       tools/bench/sample_cost.c tests/unit/helpers/test_sample_ref.c build/libkvmem.a \
 *       $(pkg-config --libs liburing numa libxxhash libpcre2-8 jansson) \
 *       -lopenblas -lunistring -lm -lpthread -fopenmp && /tmp/sample_cost [DRAWS]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kvmem/sample.h"
#include "test_sample_ref.h"	/* tests/unit/helpers: the qsort path */

#define VOCAB 151936

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
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
			x = test_sample_qsort(l, VOCAB, &cfg[c], &a);
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
