/* SPDX-License-Identifier: MIT */
/* A float's bits and back (memcpy: no aliasing rules broken), for the CPU
 * kernels that work on the bits (numfmt.c, fp8.c) and the tests that
 * compare or print exact values. */
#ifndef KVMEM_KERNELS_CPU_BITS_H
#define KVMEM_KERNELS_CPU_BITS_H

#include <stdint.h>
#include <string.h>

static inline uint32_t f32_bits(float x)
{
	uint32_t u;

	memcpy(&u, &x, sizeof(u));
	return u;
}

static inline float bits_f32(uint32_t u)
{
	float x;

	memcpy(&x, &u, sizeof(x));
	return x;
}

#endif
