// SPDX-License-Identifier: MIT
/*
 * How the cpu backend rounds a new token's raw K and V when it emulates a
 * KV dtype (kernels/kernels_fp8.h, enum kvmem_kv_round): the research knob
 * KVMEM_CPU_KV_ROUND (Documentation/recall.md, "Where fp8 KV loses
 * recall"). Every mode but the centred ones is a function of one row
 * alone, so a token rounds to the same bits in a chunked prefill, a decode
 * step and a page placed into a view; the centred ones (fp8-kc, fp8-kc-k)
 * depend on the token's block of K rows, whole or not (kvmem_kv_round_k_run).
 * Nothing here is a page format: the GPU's fp8 pages keep one scale a row
 * (fp8.c).
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/kernels_fp8.h"
#include "kvmem/kvmem.h"

static const char *const names[] = {
	[KVMEM_KV_ROUND_NONE] = "none",
	[KVMEM_KV_ROUND_BF16] = "bf16",
	[KVMEM_KV_ROUND_FP8] = "fp8",
	[KVMEM_KV_ROUND_FP8_K] = "fp8-k",
	[KVMEM_KV_ROUND_FP8_V] = "fp8-v",
	[KVMEM_KV_ROUND_FP8_G32] = "fp8-g32",
	[KVMEM_KV_ROUND_FP8_G16] = "fp8-g16",
	[KVMEM_KV_ROUND_INT8] = "int8",
	[KVMEM_KV_ROUND_FP8_KC] = "fp8-kc",
	[KVMEM_KV_ROUND_FP8_KC_K] = "fp8-kc-k",
};
#define N_MODES ((int)(sizeof(names) / sizeof(names[0])))

int kvmem_kv_round_parse(const char *s)
{
	if (!s || !*s)
		return KVMEM_KV_ROUND_NONE;
	for (int m = 0; m < N_MODES; m++)
		if (!strcmp(s, names[m]))
			return m;
	return kvmem_error(EINVAL, "KVMEM_CPU_KV_ROUND=%s: not a rounding; one of none, bf16, "
			   "fp8, fp8-k, fp8-v, fp8-g32, fp8-g16, int8, fp8-kc, fp8-kc-k", s);
}

const char *kvmem_kv_round_name(int mode)
{
	return mode >= 0 && mode < N_MODES ? names[mode] : "?";
}

void kvmem_fp8_roundtrip_groups(float *x, size_t rows, int n, int group)
{
	/* A group that does not divide the row ends in a shorter one. */
	for (size_t r = 0; r < rows; r++)
		for (int g0 = 0; g0 < n; g0 += group)
			kvmem_fp8_roundtrip_rows(x + r * (size_t)n + g0, 1,
						 n - g0 < group ? n - g0 : group);
}

void kvmem_int8_roundtrip_rows(float *x, size_t rows, int n)
{
	for (size_t r = 0; r < rows; r++) {
		float *row = x + r * (size_t)n, amax = 0.0f, s;

		for (int i = 0; i < n; i++)
			if (isfinite(row[i]) && fabsf(row[i]) > amax)
				amax = fabsf(row[i]);
		if (amax == 0.0f)
			continue;
		s = amax / 127.0f;
		for (int i = 0; i < n; i++) {
			float q = rintf(row[i] / s);

			row[i] = (q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q) * s;
		}
	}
}

void kvmem_fp8_centred_roundtrip(float *x, size_t rows, size_t ld, int n)
{
	float m[1024], d[1024];

	if (!rows)
		return;
	if (n > 1024) {	/* beyond any head_dim here: plain fp8 rather than overrun */
		for (size_t r = 0; r < rows; r++)
			kvmem_fp8_roundtrip_rows(x + r * ld, 1, n);
		return;
	}
	for (int i = 0; i < n; i++) {
		double sum = 0;

		for (size_t r = 0; r < rows; r++)
			sum += x[r * ld + i];
		m[i] = (float)(sum / (double)rows);
	}
	for (size_t r = 0; r < rows; r++) {
		float *row = x + r * ld;

		for (int i = 0; i < n; i++)
			d[i] = row[i] - m[i];
		kvmem_fp8_roundtrip_rows(d, 1, n);
		for (int i = 0; i < n; i++)
			row[i] = m[i] + d[i];
	}
}

static int centred(int mode)
{
	return mode == KVMEM_KV_ROUND_FP8_KC || mode == KVMEM_KV_ROUND_FP8_KC_K;
}

void kvmem_kv_round_k_run(float *k, int n_tok, int heads, int n, int64_t pos0, int block,
			  int mode)
{
	const size_t ld = (size_t)heads * n;

	if (!centred(mode)) {
		kvmem_kv_round_rows(k, (size_t)n_tok * heads, n, mode, 0);
		return;
	}
	for (int t = 0; t < n_tok;) {
		/* the run's rows of the block of slot pos0 + t */
		const int64_t p = pos0 + t, start = p - p % block;
		const int len = (int)(start + block - p < n_tok - t ? start + block - p : n_tok - t);
		float *rows = k + (size_t)t * ld;

		if (start == p && len == block)
			for (int h = 0; h < heads; h++)
				kvmem_fp8_centred_roundtrip(rows + (size_t)h * n, (size_t)len, ld, n);
		else
			kvmem_fp8_roundtrip_rows(rows, (size_t)len * heads, n);
		t += len;
	}
}

void kvmem_kv_round_rows(float *x, size_t rows, int n, int mode, int is_v)
{
	switch (mode) {
	case KVMEM_KV_ROUND_FP8_KC:
	case KVMEM_KV_ROUND_FP8_KC_K:
		if (!is_v)
			kvmem_fp8_centred_roundtrip(x, rows, (size_t)n, n);
		else if (mode == KVMEM_KV_ROUND_FP8_KC)
			kvmem_fp8_roundtrip_rows(x, rows, n);
		break;
	case KVMEM_KV_ROUND_BF16:
		for (size_t i = 0; i < rows * (size_t)n; i++)
			x[i] = kvmem_bf16_to_f32(kvmem_f32_to_bf16(x[i]));
		break;
	case KVMEM_KV_ROUND_FP8_K:
	case KVMEM_KV_ROUND_FP8_V:
		if (is_v != (mode == KVMEM_KV_ROUND_FP8_V))
			break;	/* the other one stays fp32 */
		/* fall through */
	case KVMEM_KV_ROUND_FP8:
		kvmem_fp8_roundtrip_rows(x, rows, n);
		break;
	case KVMEM_KV_ROUND_FP8_G32:
		kvmem_fp8_roundtrip_groups(x, rows, n, 32);
		break;
	case KVMEM_KV_ROUND_FP8_G16:
		kvmem_fp8_roundtrip_groups(x, rows, n, 16);
		break;
	case KVMEM_KV_ROUND_INT8:
		kvmem_int8_roundtrip_rows(x, rows, n);
		break;
	default:	/* none */
		break;
	}
}
