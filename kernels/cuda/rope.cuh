/* SPDX-License-Identifier: MIT */
/*
 * The rotation of RoPE on bf16, shared by every kernel that rotates K into
 * the view (rope.cu: the forward pass's scatter; gather.cu: placing pages),
 * so a key gets the same bits whichever path put it at a slot. Angles in
 * double with explicit round-to-nearest products (no FMA contraction), one
 * rounding to bf16 at the end: see rope.cu.
 */
#ifndef KVMEM_CUDA_ROPE_CUH
#define KVMEM_CUDA_ROPE_CUH

#include "cuda_int.h"

#define ROPE_HALF_MAX 512	/* head_dim <= 1024 (kvmem_config_validate) */

/* Rotary pair i's frequency, theta^(-2i/hd). */
__device__ __forceinline__ double rope_freq(int i, int hd, double theta)
{
	return pow(theta, -2.0 * i / hd);
}

/* The angle at position pos of a pair of frequency f: its sine and cosine.
 * A kernel that rotates many positions takes each pair's rope_freq once. */
__device__ __forceinline__ void rope_angle_of(int pos, double f, double *sn, double *cs)
{
	sincos(__dmul_rn((double)pos, f), sn, cs);
}

/* The angle of rotary pair i at position pos: its sine and cosine. */
__device__ __forceinline__ void rope_angle(int pos, int i, int hd, double theta, double *sn,
					   double *cs)
{
	rope_angle_of(pos, rope_freq(i, hd, theta), sn, cs);
}

/* cs/sn[i] for i < half, computed by the block's threads. */
__device__ __forceinline__ void rope_angles(double *cs, double *sn, int pos, int hd, double theta)
{
	for (int i = threadIdx.x; i < hd / 2; i += blockDim.x)
		rope_angle(pos, i, hd, theta, &sn[i], &cs[i]);
}

/* Items a gather block takes, at most `run`: few enough that the grid
 * (items / run x gy blocks) still fills the GPU, 8 blocks a multiprocessor.
 * A place() call's 1024 items in blocks of 28 made 37 x 8 blocks, and the
 * bf16 step's place() took twice as long on the H200 (the bf16 gather
 * waits on its loads: it needs many blocks in flight). */
static inline int gather_run(const kvmem_cuda_ctx *c, int run, int n_items, int gy)
{
	const int most = n_items * gy / (8 * (c->sms > 0 ? c->sms : 1));

	return run < most ? run : most > 1 ? most : 1;
}

/* (x, y) = R (a, b): one rotary pair, each rounded once to bf16. */
__device__ __forceinline__ void rope_rot(uint16_t a16, uint16_t b16, double c, double s,
					 uint16_t *x, uint16_t *y)
{
	double a = bf2f(a16), b = bf2f(b16);

	*x = d2bf(__dsub_rn(__dmul_rn(a, c), __dmul_rn(b, s)));
	*y = d2bf(__dadd_rn(__dmul_rn(b, c), __dmul_rn(a, s)));
}

/* dst = R src for rotary pair i of one head (dst may equal src). */
__device__ __forceinline__ void rope_pair(uint16_t *dst, const uint16_t *src, int i, int half,
					  double c, double s)
{
	uint16_t x, y;

	rope_rot(src[i], src[i + half], c, s, &x, &y);
	dst[i] = x;
	dst[i + half] = y;
}

#endif
