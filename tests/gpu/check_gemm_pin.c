// SPDX-License-Identifier: MIT
/* kvmem_cuda_tune "gemm_pin": a row's bits among others (check_gemm_pin.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_cuda.h"
#include "kvmem/kvmem.h"
#include "check_gemm_pin.h"
#include "check_util.h"

#define ROWS 1024

static const struct shape {
	const char *name;
	int in, out, mode;
} shapes[] = {
	{ "qkv", 4096, 6144, KVMEM_GEMM_BF16 },
	{ "o", 4096, 4096, KVMEM_GEMM_F32_ADD },
	{ "gate|up", 4096, 24576, KVMEM_GEMM_BF16 },
	{ "down", 12288, 4096, KVMEM_GEMM_F32_ADD },
};

/* Slices of the 1024 rows, each no more than the 256 rows pinned alone:
 * where each begins and how many rows. */
static const int slices[][2] = { { 0, 206 }, { 206, 50 }, { 256, 2 }, { 258, 3 },
				 { 261, 256 }, { 517, 200 }, { 1000, 24 } };

static size_t ybytes(const struct shape *s, int n)
{
	return (size_t)n * s->out * (s->mode == KVMEM_GEMM_BF16 ? 2 : 4);
}

/* Rows of the slices that differ from the same rows among all 1024, with
 * gemm_pin at `pin` rows and gemm_pin_all on for the 1024 (a batched
 * prefill's GEMM), or (pin 0) each n its own algorithm. */
static long differing(const struct shape *s, int pin, const void *dx, const void *dw,
		      const void *y0)
{
	const size_t row = ybytes(s, 1);
	void *dy = dput(y0, ybytes(s, ROWS));
	unsigned char *all;
	long bad = 0;

	if (kvmem_cuda_tune(g_c, "gemm_pin", pin) < 0 ||
	    (pin && kvmem_cuda_tune(g_c, "gemm_pin_all", 1) < 0))
		die("gemm_pin");
	if (kvmem_cuda_gemm_bf16(g_c, dy, s->mode, dx, dw, ROWS, s->in, s->out))
		die("gemm of all rows");
	if (pin)
		kvmem_cuda_tune(g_c, "gemm_pin_all", 0);
	all = dget(dy, ybytes(s, ROWS));
	for (size_t k = 0; k < sizeof(slices) / sizeof(slices[0]); k++) {
		const int a = slices[k][0], m = slices[k][1];
		void *ds = dput((const char *)y0 + (size_t)a * row, (size_t)m * row);
		unsigned char *one;

		if (kvmem_cuda_gemm_bf16(g_c, ds, s->mode, (const uint16_t *)dx + (size_t)a * s->in,
					 dw, m, s->in, s->out))
			die("gemm of a slice");
		one = dget(ds, (size_t)m * row);
		for (int r = 0; r < m; r++)
			bad += memcmp(one + (size_t)r * row, all + (size_t)(a + r) * row, row) != 0;
		free(one);
		kvmem_cuda_free(ds);
	}
	free(all);
	kvmem_cuda_free(dy);
	return bad;
}

static int slice_rows(void)
{
	int n = 0;

	for (size_t k = 0; k < sizeof(slices) / sizeof(slices[0]); k++)
		n += slices[k][1];
	return n;
}

struct gemm_run {
	const struct shape *s;
	const void *x, *w;
	void *y;
	int n;
};

static int run_gemm(void *arg)
{
	const struct gemm_run *g = arg;

	return kvmem_cuda_gemm_bf16(g_c, g->y, g->s->mode, g->x, g->w, g->n, g->s->in, g->s->out);
}

void check_gemm_pin(void)
{
	static const int pins[] = { 256 };
	static const int ns[] = { 32, 206, 1024 };
	void *dx[4], *dw[4], *dy[4];
	float *y0[4];

	for (int i = 0; i < 4; i++) {
		const struct shape *s = &shapes[i];
		uint16_t *x = rand_bf16((size_t)ROWS * s->in, -1, 1);
		uint16_t *w = rand_bf16((size_t)s->out * s->in, -0.05, 0.05);

		y0[i] = rand_f32((size_t)ROWS * s->out, -2, 2);
		dx[i] = dput(x, (size_t)ROWS * s->in * 2);
		dw[i] = dput(w, (size_t)s->out * s->in * 2);
		dy[i] = dput(y0[i], ybytes(s, ROWS));
		free(x);
		free(w);
	}
	for (int i = 0; i < 4; i++) {
		const struct shape *s = &shapes[i];
		const long own = differing(s, 0, dx[i], dw[i], y0[i]);

		for (size_t p = 0; p < sizeof(pins) / sizeof(pins[0]); p++) {
			const long bad = differing(s, pins[p], dx[i], dw[i], y0[i]);

			report(!bad, "gemm pinned at %4d rows, %-7s %5d -> %5d: %ld of %d slice rows "
			       "differ from the same rows among 1024 (each n its own algorithm: %ld)",
			       pins[p], s->name, s->in, s->out, bad, slice_rows(), own);
		}
	}
	printf("the four 8B layer GEMMs, median of 20 runs, ms (TFLOP/s):\n%-12s", "rows");
	for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++)
		printf(" %20d", ns[k]);
	printf("\n");
	/* Each n its own; pinned at 256 (a longer chunk keeps its own); and
	 * pinned for any n, as a batched prefill's GEMMs are. */
	for (int p = 0; p < 3; p++) {
		static const char *const name[] = { "each n", "pinned 256", "256, all" };

		if (kvmem_cuda_tune(g_c, "gemm_pin", p ? 256 : 0) < 0 ||
		    kvmem_cuda_tune(g_c, "gemm_pin_all", p == 2) < 0)
			die("gemm_pin");
		printf("%-12s", name[p]);
		for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
			double ms = 0, flop = 0;

			for (int i = 0; i < 4; i++) {
				struct gemm_run g = { &shapes[i], dx[i], dw[i], dy[i], ns[k] };

				ms += time_ms(run_gemm, &g, 3, 20);
				flop += 2.0 * ns[k] * shapes[i].in * shapes[i].out;
			}
			printf(" %10.3f (%6.1f)", ms, flop / ms / 1e9);
		}
		printf("\n");
	}
	kvmem_cuda_tune(g_c, "gemm_pin_all", 0);
	kvmem_cuda_tune(g_c, "gemm_pin", 0);
	for (int i = 0; i < 4; i++) {
		kvmem_cuda_free(dx[i]);
		kvmem_cuda_free(dw[i]);
		kvmem_cuda_free(dy[i]);
		free(y0[i]);
	}
}
