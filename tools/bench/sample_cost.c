// SPDX-License-Identifier: MIT
/*
 * What a draw at a temperature costs over Qwen3's 151,936 logits on this
 * CPU: kvmem_sample (its full rank order by a radix sort on rank keys) beside
 * the qsort it replaced (ids by ranks_before's rule, then the same softmax and
 * draw), in the same run, on the same logits; the draws must agree. Then
 * a draw a thread side by side, as kvmem serve makes a round's draws.
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

#include <omp.h>

#include "kvmem/sample.h"
#include "test_sample_ref.h"	/* tests/unit/helpers: the qsort path */

#define VOCAB 151936

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/*
 * kvmem serve's way (turn_predraw): one draw a stream, the streams' draws
 * side by side on OpenMP's threads, against one draw alone in the same
 * run; near 1.00x when the draws do not slow each other down (the
 * allocator's mmap and munmap of each draw's buffers did: page faults,
 * and a TLB shootdown to every thread at each munmap).
 */
static void side_by_side(const float *l, int draws)
{
	const kvmem_sampler s = { .temperature = 0.8f };
	const int threads = omp_get_max_threads();
	double alone = 0, t0, side = 0;
	uint64_t r = kvmem_rng_seed(3);

	for (int d = 0; d < draws; d++) {
		t0 = now_s();
		(void)kvmem_sample(l, VOCAB, &s, &r);
		alone += now_s() - t0;
	}
	for (int d = 0; d < draws; d++) {
		t0 = now_s();
#pragma omp parallel for schedule(dynamic, 1)
		for (int k = 0; k < threads; k++) {
			uint64_t rk = kvmem_rng_seed((uint64_t)k);

			(void)kvmem_sample(l, VOCAB, &s, &rk);
		}
		side += now_s() - t0;
	}
	printf("side by side: %d draws at T 0.8 on %d threads %.1f us, one alone %.1f us: %.2fx\n",
	       threads, threads, side / draws * 1e6, alone / draws * 1e6, side / alone);
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
		uint64_t a = kvmem_rng_seed(7), b = a, warm = a;
		double tq = 0, tk = 0, t0;
		int same = 1;

		(void)kvmem_sample(l, VOCAB, &cfg[c], &warm);	/* buffers and threads made */
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
	side_by_side(l, draws);
	free(l);
	return 0;
}
