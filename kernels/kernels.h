/* SPDX-License-Identifier: MIT */
/*
 * kvmem compute kernels: one C signature per op.
 *
 * Each op has a CPU reference twin in kernels/cpu/ (the functions below).
 * A CUDA version, when it exists, lives in kernels/cuda/ with the same
 * arguments and a kvmem_cuda_ prefix, taking device pointers; tests compare
 * the two on fresh random inputs.
 *
 * Layouts (row-major, fp32 unless said):
 *   activations  x[n][dim]                  one row per token
 *   queries      q[n][n_heads][head_dim]    token-major, as projected
 *   KV (views)   k[n_kv_heads][stride][head_dim]  head-major: each KV head
 *                is a contiguous [tokens][head_dim] run, `stride` tokens apart
 *   weights      w[out][in]                 as Hugging Face stores them
 *
 * RoPE is the "rotate half" form Qwen3/Llama use: for i < head_dim/2 the pair
 * (x[i], x[i + head_dim/2]) turns by angle pos * theta^(-2i/head_dim).
 * Angles are computed in double so positions in the millions stay precise.
 */
#ifndef KVMEM_KERNELS_H
#define KVMEM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/draw_fixed.h"
#include "kvmem/sample.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- number formats --------------------------------------------------- */
float kvmem_bf16_to_f32(uint16_t h);
uint16_t kvmem_f32_to_bf16(float f);	/* round to nearest even, NaN kept */
float kvmem_f16_to_f32(uint16_t h);
uint16_t kvmem_f32_to_f16(float f);	/* round to nearest even, inf/NaN kept */
void kvmem_bf16_to_f32_n(float *dst, const uint16_t *src, size_t n);
/* n values of kvmem_f32_to_bf16, the same bits, in a loop the compiler
 * vectorises (7x the element-wise calls: what the store's rows take). */
void kvmem_f32_to_bf16_n(uint16_t *dst, const float *src, size_t n);
void kvmem_f16_to_f32_n(float *dst, const uint16_t *src, size_t n);

/* The kernels' pool for work of tens of microseconds (kernels/cpu/pool.c):
 * fn(arg, c) for every c in 0..n-1, on this thread and the pool's workers
 * (OpenMP's thread count less one), returning when all have run. The
 * caller takes chunks itself and never waits for a worker that has not
 * started one. Chunks must write disjoint outputs. */
typedef void (*kvmem_pool_fn)(void *arg, int chunk);
void kvmem_pool_run(int n, kvmem_pool_fn fn, void *arg);

/* ---- dense ------------------------------------------------------------ */
/*
 * y[n][out] = x[n][in] · w[out][in]^T, threaded over the output columns.
 * Each element is one chain of fused multiply-adds over in, in order (s =
 * fma(x[k], w[c][k], s) from 0): its bits depend only on that row of x and
 * on w, never on n, the other rows, the thread count or the instruction set
 * (kernels/cpu/matmul.c), so a session's logits are the same alone or in a
 * batched forward.
 */
void kvmem_matmul(float *y, const float *x, const float *w, int n, int in, int out);
/* The same with w[out][in] as bf16 bits, widened in registers: kvmem_matmul's
 * bits over the widened weights, half the bytes read. */
void kvmem_matmul_bf16w(float *y, const float *x, const uint16_t *w, int n, int in, int out);
/* w[out][in] packed into panels of 32 columns (kernels/cpu/
 * matmul_panels.c): kvmem_panels_count(in, out) elements at dst, bf16
 * (kvmem_panels_pack) or fp32 (_f32), then the product over them:
 * kvmem_matmul's bits over the same values, quicker at every row count
 * (the cpu engine's weights). */
size_t kvmem_panels_count(int in, int out);
void kvmem_panels_pack(uint16_t *dst, const uint16_t *w, int in, int out);
void kvmem_panels_pack_f32(float *dst, const float *w, int in, int out);
void kvmem_matmul_panels(float *y, const float *x, const uint16_t *p, int n, int in, int out);
void kvmem_matmul_panels_f32(float *y, const float *x, const float *p, int n, int in, int out);
/* The instruction set the products use, chosen once per process: "avx512",
 * "avx2" or "c" (the best the CPU has, or $KVMEM_MATMUL's).
 * kvmem_matmul_use() picks another (tests, benchmarks): -ENOTSUP when the
 * CPU lacks it, -EINVAL for an unknown name. The bits are the same at
 * every one; the time is not. */
const char *kvmem_matmul_isa(void);
int kvmem_matmul_use(const char *isa);
/* The same product by OpenBLAS (sgemv for one row, else sgemm): the
 * ceiling a benchmark holds kvmem_matmul against. Not batch invariant. */
void kvmem_matmul_blas(float *y, const float *x, const float *w, int n, int in, int out);

/* out[i][:] = table[ids[i]][:]; ids must be in [0, vocab). */
void kvmem_embedding(float *out, const float *table, const int32_t *ids, int n, int dim);

/* out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * w, per row of `dim`.
 * out may equal x. Sum of squares accumulated in double. */
void kvmem_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps);

/* y[i] += x[i] */
void kvmem_add(float *y, const float *x, size_t n);

/* out[i] = silu(gate[i]) * up[i]; out may equal gate or up. e^x is
 * kvmem_expf's at every width: an element's bits depend on its inputs only. */
void kvmem_swiglu(float *out, const float *gate, const float *up, size_t n);
/* e^x within 2 ulp for x in [-87, 88] (clamped there first; NaN gives NaN),
 * the bits the vectorised forms in SwiGLU and attention's softmax give
 * (vexp.h). */
float kvmem_expf(float x);
/* Run those forms at width 16, 8 or 1 from now on (tests): 0, -ENOTSUP when
 * the CPU lacks it, -EINVAL for another width. The bits do not change. */
int kvmem_vexp_use(int width);

/* ---- rotary position embedding --------------------------------------- */
/* Rotate in place x[n][n_heads][head_dim], token t at position pos[t]. */
void kvmem_rope(float *x, const int32_t *pos, int n, int n_heads, int head_dim, double theta);
/* The exact inverse rotation (angle -pos). */
void kvmem_rope_inverse(float *x, const int32_t *pos, int n, int n_heads, int head_dim,
		      double theta);
/* Rotate x[n][head_dim] (one head's rows) by angles ang from
 * kvmem_rope_angles (kernels_bf16.h: [n][head_dim/2] pairs of cos, sin):
 * kvmem_rope's bits, the angles made once for every head and layer that
 * sits at the same positions. */
void kvmem_rope_ang(float *x, int n, int head_dim, const double *ang);

/* ---- attention -------------------------------------------------------- */
/*
 * Causal GQA attention over a head-major KV view.
 *   q    [n_q][n_heads][head_dim]  (already rotated)
 *   k, v [n_kv_heads][kv_stride][head_dim], tokens 0..n_kv-1 valid
 *   q_pos[n_q], kv_pos[n_kv]: query i sees key j iff kv_pos[j] <= q_pos[i]
 *   out  [n_q][n_heads][head_dim]
 * Query head h reads KV head h / (n_heads / n_kv_heads).
 * scale is usually 1/sqrt(head_dim). Softmax in fp32 with max subtraction;
 * the result depends only on the inputs, never on threading.
 */
void kvmem_attention(float *out, const float *q, const int32_t *q_pos, int n_q,
		   const float *k, const float *v, const int32_t *kv_pos, int n_kv,
		   size_t kv_stride, int n_heads, int n_kv_heads, int head_dim, float scale);

/*
 * Batched attention: several sequences' queries in one call, each sequence
 * over its own view (its own K / V, length and stride), as a batched
 * forward runs its layer. Sequence s's queries are rows q0..q0+n_q-1 of q
 * and out ([rows][n_heads][head_dim]); each gets exactly the bits
 * kvmem_attention gives it alone (one (query, KV head) item is computed
 * start to end by one thread, in the same order). The CUDA version is
 * kvmem_cuda_attention_batch (kernels/kernels_cuda_batch.h).
 */
typedef struct kvmem_att_seq {
	int q0, n_q;
	const int32_t *q_pos;		/* [n_q] */
	const float *k, *v;		/* [n_kv_heads][kv_stride][head_dim] */
	const int32_t *kv_pos;		/* [n_kv] */
	int n_kv;
	size_t kv_stride;
} kvmem_att_seq;

void kvmem_attention_batch(float *out, const float *q, const kvmem_att_seq *seqs, int n_seqs,
			   int n_heads, int n_kv_heads, int head_dim, float scale);
/* The attention's instruction set, chosen once per process: "avx512" (F
 * and DQ: two heads a register), "avx2" (eight keys' dot products at once)
 * or "c" (the plain loops), the best the CPU has or $KVMEM_ATTENTION's.
 * kvmem_attention_use() picks another (tests, benchmarks): -ENOTSUP when
 * the CPU lacks it, -EINVAL for an unknown name. The bits are the same at
 * every one; the time is not. */
const char *kvmem_attention_isa(void);
int kvmem_attention_use(const char *isa);

/* kvmem_sample's greedy draw (the first of the highest logits) in about one
 * pass, or -1 when a logit is NaN or infinite, *bad then its first index
 * (else -1): the check a session makes before it draws, in the same pass. */
int kvmem_argmax_finite(const float *logits, int vocab, int *bad);
/* Its AVX-512 form on or off (tests: both give the same index); -ENOTSUP
 * when the CPU lacks AVX-512 F and DQ. The best the CPU has by default. */
int kvmem_argmax_use_avx512(int on);
/* A draw's weight e^x (x = (logit - top) / T <= 0, in double) as kvmem_sample
 * makes it: within 2 ulp of e^x, 0 below -745.2 or for NaN, the same bits
 * at every width (kernels/cpu/wexp.h); the reference for the draw's twins. */
double kvmem_sample_weight(double x);
/* x[i] = kvmem_sample_weight(x[i]) for i < n, at the width in use. */
void kvmem_sample_weights(double *x, int n);
/* kvmem_sample's weights at width 8 (AVX-512), 4 (AVX2) or 1 from now on
 * (tests): 0, -ENOTSUP when the CPU lacks it, -EINVAL for another width. */
int kvmem_sample_weight_use(int width);

/* kvmem_sample with the ids banned[0..n_banned) never drawn: set to -inf in
 * logits for the draw and put back (a copy past KVMEM_DRAW_BANNED_MAX ids),
 * so the caller's logits end as they were. kvmem_sample's result: when every
 * logit is -inf or banned, its first candidate (a banned or -inf id). */
int kvmem_sample_without(float *logits, int vocab, const kvmem_sampler *s, uint64_t *rng,
			 const int32_t *banned, int n_banned);
/* A batched step's draw at a temperature for one row (kvmem_fwd_item.draw;
 * the twin of kvmem_cuda_draw_rows): kvmem_sample over logits with d's
 * banned ids at -inf (set there and put back), from a copy of d->rng; -1
 * when a logit is NaN or infinite, every one is banned or memory ran out
 * (the host draws then, and says why). */
int kvmem_sample_spec(float *logits, int vocab, const kvmem_draw_spec *d);

/* splitmix64's output function: a bijective 64-bit mix. */
uint64_t kvmem_mix64(uint64_t z);
#define KVMEM_GOLDEN_GAMMA 0x9e3779b97f4a7c15ull

/* ---- workspace summaries ---------------------------------------------- */
/* sum[h][d] += k[t][h][d] over n tokens of token-major raw K [n][n_kv_heads][head_dim]
 * (the running sum behind Mean-K; fp32 accumulation). */
void kvmem_meank_accumulate(float *sum, const float *k, int n, int n_kv_heads, int head_dim);

#ifdef __cplusplus
}
#endif
#endif
