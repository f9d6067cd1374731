/* SPDX-License-Identifier: MIT */
/* A float's bits and back, for tests that compare or print exact values. */
#ifndef KVMEM_TEST_BITS_H
#define KVMEM_TEST_BITS_H

#include <stdint.h>
#include <string.h>

static inline uint32_t test_f32_bits(float x)
{
	uint32_t u;

	memcpy(&u, &x, sizeof(u));
	return u;
}

static inline float test_bits_f32(uint32_t u)
{
	float x;

	memcpy(&x, &u, sizeof(x));
	return x;
}

#endif
