/* SPDX-License-Identifier: MIT */
/*
 * fp8 KV: the e4m3 number format and its scales, CPU twins of
 * kernels/cuda/fp8.cu (kvmem_cuda_fp8_*).
 *
 * e4m3 ("fn", as Hopper's cvt and OCP's FP8 spell it): 1 sign bit, 4
 * exponent bits (bias 7), 3 mantissa bits; no infinity; 0x7f / 0xff are
 * NaN; the largest finite value is 448, the smallest normal 2^-6, the
 * subnormals m * 2^-9 (m = 1..7). Conversion from fp32 rounds to nearest
 * even and saturates: anything finite or infinite beyond 448 becomes +-448
 * (".satfinite"), a NaN becomes 0x7f (either sign).
 *
 * Scales: one per row of head_dim values (one token in one KV head), a
 * power of two 2^e, the smallest that brings the row's largest finite
 * magnitude to at most 448 (so it lands in (224, 448]), clamped to
 * [2^-126, 2^120]; 1 for a row of zeros. Per row and not per block: a
 * token's bytes are fixed the moment it is computed, whatever comes after
 * it in its block, so a forward pass can attend to fp8 K/V it has just
 * written, a decode step never rewrites an earlier token, and a chunked
 * prefill gives the bytes of a token-by-token one (a per-block scale would
 * change with the block's later tokens). A power of two makes x / scale
 * and q * scale exact: the CPU and the GPU agree bit for bit, and
 * dequantising never rounds. The cost is 4 bytes per 128-byte row (3%).
 *
 * An fp8 page (Documentation/formats.md): K bytes [H][B][D], V bytes
 * [H][B][D], K scales [H][B] then V scales [H][B] as fp32.
 */
#ifndef KVMEM_KERNELS_FP8_H
#define KVMEM_KERNELS_FP8_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVMEM_E4M3_MAX 448.0f
#define KVMEM_E4M3_NAN 0x7f

float kvmem_e4m3_to_f32(uint8_t q);
uint8_t kvmem_f32_to_e4m3(float x);	/* nearest even, saturating, NaN kept */

/* The scale of a row of n values (a power of two; see above). */
float kvmem_fp8_row_scale(const float *x, int n);
/* q[i] = e4m3(x[i] / scale), *scale the row's: one row of n values. */
void kvmem_fp8_quant_row(uint8_t *q, float *scale, const float *x, int n);
/* x[i] = q[i] * scale (exact). */
void kvmem_fp8_dequant_row(float *x, const uint8_t *q, float scale, int n);
/* rows rows of n values each, in place: what quantising and dequantising
 * them gives (the values an fp8 view holds), the same bits as the two
 * calls above. */
void kvmem_fp8_roundtrip_rows(float *x, size_t rows, int n);

#ifdef __cplusplus
}
#endif
#endif
