// SPDX-License-Identifier: MIT
/*
 * SwiGLU, out = silu(gate) * up with silu(g) = g / (1 + e^-g), sixteen or
 * eight elements at a time, with e^x from vexp.h: an element's bits depend
 * on its gate and up values only (not on n, its place in a vector or the
 * tail, the instruction set), so a row decoded alone or in a batch gets the
 * same bits. silu is within 4e-6 relative of the exact value
 * (tests/unit/test_kernels.c). A batched decode step of 8 sessions of the
 * embedded model spent 0.12 of its 2.3 ms in libm's expf here.
 *
 * Also kvmem_expf, the scalar e^x every width matches, and the width
 * chosen for this CPU.
 */
#include <errno.h>
#include <pthread.h>

#include "kernels/cpu/vexp.h"
#include "kernels/kernels.h"

static int width;
static pthread_once_t width_once = PTHREAD_ONCE_INIT;

static int supported(int w)
{
	__builtin_cpu_init();
	return w == 1 || (w == 8 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ||
	       (w == 16 && __builtin_cpu_supports("avx512f"));
}

static void choose(void)
{
	width = supported(16) ? 16 : supported(8) ? 8 : 1;
}

int vexp_width(void)
{
	pthread_once(&width_once, choose);
	return width;
}

int kvmem_vexp_use(int w)
{
	pthread_once(&width_once, choose);
	if (w != 1 && w != 8 && w != 16)
		return -EINVAL;
	if (!supported(w))
		return -ENOTSUP;
	width = w;
	return 0;
}

float kvmem_expf(float x)
{
	return vexp1(x);
}

static void swiglu_c(float *out, const float *gate, const float *up, size_t i, size_t n)
{
	for (; i < n; i++) {
		float g = gate[i];

		out[i] = g / (1.0f + vexp1(-g)) * up[i];
	}
}

__attribute__((target("avx512f")))
static void swiglu_512(float *out, const float *gate, const float *up, size_t n)
{
	const __m512 one = _mm512_set1_ps(1.0f);
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		__m512 g = _mm512_loadu_ps(gate + i);
		__m512 s = _mm512_div_ps(g, _mm512_add_ps(one, vexp16(vexp_neg16(g))));

		_mm512_storeu_ps(out + i, _mm512_mul_ps(s, _mm512_loadu_ps(up + i)));
	}
	swiglu_c(out, gate, up, i, n);
}

__attribute__((target("avx2,fma")))
static void swiglu_256(float *out, const float *gate, const float *up, size_t n)
{
	const __m256 one = _mm256_set1_ps(1.0f);
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m256 g = _mm256_loadu_ps(gate + i);
		__m256 s = _mm256_div_ps(g, _mm256_add_ps(one, vexp8(vexp_neg8(g))));

		_mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
	}
	swiglu_c(out, gate, up, i, n);
}

void kvmem_swiglu(float *out, const float *gate, const float *up, size_t n)
{
	int w = vexp_width();

	if (w == 16)
		swiglu_512(out, gate, up, n);
	else if (w == 8)
		swiglu_256(out, gate, up, n);
	else
		swiglu_c(out, gate, up, 0, n);
}
