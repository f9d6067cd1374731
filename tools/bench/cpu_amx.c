// SPDX-License-Identifier: MIT
/*
 * Whether this CPU's bf16 dot-product instructions could serve the cpu
 * backend's products (issue #26's CPU row), measured: their sums against
 * the sequential chains every instruction set level of kvmem can give bit
 * for bit, and AMX's speed on the step's 11 MB of bf16 weights at 1 and 8
 * rows (the panels' figures: tools/bench/cpu_step_bytes.c, the same hour).
 *
 *   gcc -O2 -mavx512f -mavx512bf16 -mamx-tile -mamx-bf16 \
 *       -o /tmp/cpu_amx tools/bench/cpu_amx.c -lm -lpthread && /tmp/cpu_amx
 *
 * Needs AMX-BF16 and AVX512-BF16 (/proc/cpuinfo: amx_bf16, avx512_bf16)
 * and a kernel that grants the tile data (arch_prctl ARCH_REQ_XCOMP_PERM,
 * Linux 5.16 on).
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* The tile configuration LDTILECFG reads (palette 1). */
struct tilecfg {
	uint8_t palette, start_row, reserved[14];
	uint16_t colsb[16];
	uint8_t rows[16];
} __attribute__((packed));

static float bf(uint16_t h)
{
	const uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

static uint16_t to_bf(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	u += 0x7fff + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

static uint64_t rng = 88172645463325252ull;

/* A bf16 value of either sign over 2^-8 .. 2^8: products stay normal. */
static uint16_t draw(void)
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	const double u = (double)(rng >> 11) / 9007199254740992.0;

	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return to_bf((float)((u - 0.5) * ldexp(1.0, (int)(rng % 16) - 8)));
}

/* VDPBF16PS against three sequential models of one pair's two products
 * (each exact in fp32): odd then even, even then odd, and the pair summed
 * once before it is added. */
static void check_vdpbf16ps(int n)
{
	long miss[3] = { 0, 0, 0 };

	for (int t = 0; t < n; t++) {
		uint16_t a[32], b[32];
		float c[16], v[16];

		for (int i = 0; i < 32; i++)
			a[i] = draw(), b[i] = draw();
		for (int i = 0; i < 16; i++)
			c[i] = bf(draw());
		_mm512_storeu_ps(v, _mm512_dpbf16_ps(_mm512_loadu_ps(c),
						     (__m512bh)_mm512_loadu_si512(a),
						     (__m512bh)_mm512_loadu_si512(b)));
		for (int j = 0; j < 16; j++) {
			const float x0 = bf(a[2 * j]) * bf(b[2 * j]);
			const float x1 = bf(a[2 * j + 1]) * bf(b[2 * j + 1]);

			miss[0] += v[j] != (c[j] + x1) + x0;
			miss[1] += v[j] != (c[j] + x0) + x1;
			miss[2] += v[j] != c[j] + (float)((double)x0 + x1);
		}
	}
	printf("VDPBF16PS, %d sums: differs from odd-then-even in %ld, even-then-odd in %ld, "
	       "the pair summed first in %ld\n", 16 * n, miss[0], miss[1], miss[2]);
}

/* TDPBF16PS over k bf16 values a row (2 .. 32) against the same models,
 * pair after pair. */
static void check_tdpbf16ps(int k, int n)
{
	static uint16_t A[16][32], B[16][32];
	static float C[16][16], C0[16][16];
	long miss[3] = { 0, 0, 0 };
	struct tilecfg cfg;

	memset(&cfg, 0, sizeof(cfg));
	cfg.palette = 1;
	cfg.rows[0] = 16, cfg.colsb[0] = 64;		/* C: 16 x 16 fp32 */
	cfg.rows[1] = 16, cfg.colsb[1] = 2 * k;		/* A: 16 x k bf16 */
	cfg.rows[2] = k / 2, cfg.colsb[2] = 64;		/* B: k / 2 pairs x 16 columns */
	_tile_loadconfig(&cfg);
	for (int t = 0; t < n; t++) {
		for (int m = 0; m < 16; m++)
			for (int i = 0; i < k; i++)
				A[m][i] = draw();
		for (int p = 0; p < k / 2; p++)
			for (int i = 0; i < 32; i++)
				B[p][i] = draw();
		for (int m = 0; m < 16; m++)
			for (int j = 0; j < 16; j++)
				C0[m][j] = C[m][j] = bf(draw());
		_tile_loadd(0, C, 64);
		_tile_loadd(1, A, 64);
		_tile_loadd(2, B, 64);
		_tile_dpbf16ps(0, 1, 2);
		_tile_stored(0, C, 64);
		for (int m = 0; m < 16; m++)
			for (int j = 0; j < 16; j++) {
				float s[3] = { C0[m][j], C0[m][j], C0[m][j] };

				for (int p = 0; p < k / 2; p++) {
					const float x0 = bf(A[m][2 * p]) * bf(B[p][2 * j]);
					const float x1 = bf(A[m][2 * p + 1]) * bf(B[p][2 * j + 1]);

					s[0] = (s[0] + x1) + x0;
					s[1] = (s[1] + x0) + x1;
					s[2] = s[2] + (float)((double)x0 + x1);
				}
				for (int i = 0; i < 3; i++)
					miss[i] += C[m][j] != s[i];
			}
	}
	_tile_release();
	printf("TDPBF16PS, %2d values a row, %d sums: differs from odd-then-even in %ld, "
	       "even-then-odd in %ld, the pair summed first in %ld\n", k, 256 * n, miss[0], miss[1],
	       miss[2]);
}

/* ---- AMX's speed: rows x 256 activations against in = 256 x out bf16
 * weights, packed as B tiles (32 values a column, as 16 pairs), four
 * 16-column panels at a time, the panels split between two threads. */
enum { IN = 256 };
static uint16_t *W, X[16 * IN];
static float *Y;
static int OUT, ROWS;

struct half {
	int p0, p1;
};

static void *product(void *arg)
{
	const struct half *h = arg;
	const int kb = IN / 32;
	struct tilecfg cfg;

	memset(&cfg, 0, sizeof(cfg));
	cfg.palette = 1;
	for (int t = 0; t < 5; t++)	/* C tiles 0-3 and the activations' tile 4 */
		cfg.rows[t] = ROWS, cfg.colsb[t] = 64;
	for (int t = 5; t < 8; t++)	/* the weights' tiles */
		cfg.rows[t] = 16, cfg.colsb[t] = 64;
	_tile_loadconfig(&cfg);
	for (int p = h->p0; p < h->p1; p += 4) {
		const uint16_t *b = W + (size_t)p * kb * 512;

		_tile_zero(0);
		_tile_zero(1);
		_tile_zero(2);
		_tile_zero(3);
		for (int k = 0; k < kb; k++, b += 512) {
			_tile_loadd(4, X + 32 * k, IN * 2);
			_tile_loadd(5, b, 64);
			_tile_dpbf16ps(0, 4, 5);
			_tile_loadd(6, b + (size_t)kb * 512, 64);
			_tile_dpbf16ps(1, 4, 6);
			_tile_loadd(7, b + (size_t)2 * kb * 512, 64);
			_tile_dpbf16ps(2, 4, 7);
			_tile_loadd(5, b + (size_t)3 * kb * 512, 64);
			_tile_dpbf16ps(3, 4, 5);
		}
		/* _tile_stored takes a constant tile number */
		_tile_stored(0, Y + 16 * p, OUT * 4);
		_tile_stored(1, Y + 16 * p + 16, OUT * 4);
		_tile_stored(2, Y + 16 * p + 32, OUT * 4);
		_tile_stored(3, Y + 16 * p + 48, OUT * 4);
	}
	_tile_release();
	return NULL;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void time_amx(double mb, int rows)
{
	OUT = (int)(mb * 1e6 / 2 / IN) / 128 * 128;
	ROWS = rows;
	W = aligned_alloc(64, (size_t)IN * OUT * 2);
	Y = aligned_alloc(64, (size_t)16 * OUT * 4);
	if (!W || !Y) {
		fprintf(stderr, "cpu_amx: out of memory\n");
		exit(1);
	}
	for (size_t i = 0; i < (size_t)IN * OUT; i++)
		W[i] = draw();
	for (int i = 0; i < 16 * IN; i++)
		X[i] = draw();

	const int panels = OUT / 16;
	struct half lo = { 0, panels / 2 }, hi = { panels / 2, panels };
	double best = 1e9, sum = 0;

	for (int r = 0; r < 300; r++) {
		pthread_t th;
		const double t0 = now_s();

		pthread_create(&th, NULL, product, &hi);
		product(&lo);
		pthread_join(th, NULL);
		const double t = now_s() - t0;

		best = t < best ? t : best;
		sum += t;
	}
	printf("AMX products at %d row%s, %.1f MB of bf16 weights, 2 threads: fastest %.3f ms "
	       "(%.1f GB/s), mean %.3f ms\n", rows, rows == 1 ? "" : "s", (double)IN * OUT * 2 / 1e6,
	       best * 1e3, (double)IN * OUT * 2 / best / 1e9, sum / 300 * 1e3);
	free(W);
	free(Y);
}

int main(void)
{
	if (!__builtin_cpu_supports("avx512bf16")) {
		fprintf(stderr, "cpu_amx: this CPU has no AVX512-BF16\n");
		return 1;
	}
	check_vdpbf16ps(200000);
	if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) {
		perror("cpu_amx: arch_prctl(ARCH_REQ_XCOMP_PERM): no AMX tile data");
		return 1;
	}
	for (int k = 2; k <= 32; k *= 2)
		check_tdpbf16ps(k, 2000);
	time_amx(11.0, 1);
	time_amx(11.0, 8);
	time_amx(22.0, 8);
	return 0;
}
