// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * XXH3-64, seed 0, default secret, written from the xxHash specification
 * (the algorithm and its constants are public; no code is taken). Scalar
 * and portable: the 64x64->128 multiply is built from 32-bit halves, input
 * is read little-endian byte by byte where alignment is unknown.
 *
 * Four length classes: 0-16 bytes, 17-128, 129-240, and longer inputs,
 * which run 8 accumulators over 64-byte stripes, 16 stripes per block, with
 * a scramble after each block. The same file builds in the kernel module
 * (kmod/Kbuild) and in userspace (tests/unit/test_kmod_xxh3.c).
 */
#include "kvmem_xxh3.h"

#ifndef __KERNEL__
#include <string.h>
#endif

#define P32_1 0x9E3779B1u
#define P32_2 0x85EBCA77u
#define P32_3 0xC2B2AE3Du
#define P64_1 0x9E3779B185EBCA87ull
#define P64_2 0xC2B2AE3D27D4EB4Full
#define P64_3 0x165667B19E3779F9ull
#define P64_4 0x85EBCA77C2B2AE63ull
#define P64_5 0x27D4EB2F165667C5ull
#define PMX_1 0x165667919E3779F9ull
#define PMX_2 0x9FB21C651E98DF25ull

#define STRIPE 64		/* bytes per stripe */
#define SECRET_SIZE 192		/* the default secret */
#define STRIPES_PER_BLOCK ((SECRET_SIZE - STRIPE) / 8)
#define BLOCK (STRIPE * STRIPES_PER_BLOCK)

/* The default secret of the specification (kSecret). */
static const unsigned char xxh3_secret[SECRET_SIZE] = {
	0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c,
	0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb,
	0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e,
	0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
	0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6,
	0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb,
	0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97,
	0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
	0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7,
	0xc7, 0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31,
	0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64, 0xea, 0xc5, 0xac, 0x83,
	0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
	0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26,
	0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc,
	0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f,
	0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

static inline uint64_t rd64(const unsigned char *p)
{
	uint64_t v = 0;
	int i;

	for (i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static inline uint32_t rd32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static inline uint64_t rotl64(uint64_t x, unsigned int r)
{
	return (x << r) | (x >> (64 - r));
}

static inline uint64_t swap64(uint64_t x)
{
	return __builtin_bswap64(x);
}

/* The 128-bit product of a and b, folded: low half XOR high half. */
static uint64_t mul128_fold64(uint64_t a, uint64_t b)
{
	uint64_t a_lo = (uint32_t)a, a_hi = a >> 32;
	uint64_t b_lo = (uint32_t)b, b_hi = b >> 32;
	uint64_t lo_lo = a_lo * b_lo, hi_lo = a_hi * b_lo;
	uint64_t lo_hi = a_lo * b_hi, hi_hi = a_hi * b_hi;
	uint64_t cross = (lo_lo >> 32) + (uint32_t)hi_lo + lo_hi;
	uint64_t hi = (hi_lo >> 32) + (cross >> 32) + hi_hi;
	uint64_t lo = (cross << 32) | (uint32_t)lo_lo;

	return lo ^ hi;
}

static uint64_t xxh64_avalanche(uint64_t h)
{
	h ^= h >> 33;
	h *= P64_2;
	h ^= h >> 29;
	h *= P64_3;
	return h ^ (h >> 32);
}

static uint64_t xxh3_avalanche(uint64_t h)
{
	h ^= h >> 37;
	h *= PMX_1;
	return h ^ (h >> 32);
}

static uint64_t rrmxmx(uint64_t h, uint64_t len)
{
	h ^= rotl64(h, 49) ^ rotl64(h, 24);
	h *= PMX_2;
	h ^= (h >> 35) + len;
	h *= PMX_2;
	return h ^ (h >> 28);
}

static uint64_t len_0to16(const unsigned char *in, size_t len)
{
	const unsigned char *s = xxh3_secret;

	if (len > 8) {
		uint64_t lo = rd64(in) ^ (rd64(s + 24) ^ rd64(s + 32));
		uint64_t hi = rd64(in + len - 8) ^ (rd64(s + 40) ^ rd64(s + 48));
		uint64_t acc = len + swap64(lo) + hi + mul128_fold64(lo, hi);

		return xxh3_avalanche(acc);
	}
	if (len >= 4) {
		uint64_t in64 = rd32(in + len - 4) + ((uint64_t)rd32(in) << 32);

		/* The specification mixes a byte-swapped seed in: 0 here. */
		return rrmxmx(in64 ^ (rd64(s + 8) ^ rd64(s + 16)), len);
	}
	if (len > 0) {
		uint32_t c = (uint32_t)in[0] << 16 | (uint32_t)in[len >> 1] << 24 |
			     (uint32_t)in[len - 1] | (uint32_t)len << 8;

		return xxh64_avalanche((uint64_t)c ^ (rd32(s) ^ rd32(s + 4)));
	}
	return xxh64_avalanche(rd64(s + 56) ^ rd64(s + 64));
}

static uint64_t mix16(const unsigned char *in, const unsigned char *s)
{
	return mul128_fold64(rd64(in) ^ rd64(s), rd64(in + 8) ^ rd64(s + 8));
}

static uint64_t len_17to128(const unsigned char *in, size_t len)
{
	const unsigned char *s = xxh3_secret;
	uint64_t acc = len * P64_1;

	if (len > 32) {
		if (len > 64) {
			if (len > 96) {
				acc += mix16(in + 48, s + 96);
				acc += mix16(in + len - 64, s + 112);
			}
			acc += mix16(in + 32, s + 64);
			acc += mix16(in + len - 48, s + 80);
		}
		acc += mix16(in + 16, s + 32);
		acc += mix16(in + len - 32, s + 48);
	}
	acc += mix16(in, s);
	acc += mix16(in + len - 16, s + 16);
	return xxh3_avalanche(acc);
}

static uint64_t len_129to240(const unsigned char *in, size_t len)
{
	const unsigned char *s = xxh3_secret;
	uint64_t acc = len * P64_1, tail;
	size_t i, rounds = len / 16;

	for (i = 0; i < 8; i++)
		acc += mix16(in + 16 * i, s + 16 * i);
	acc = xxh3_avalanche(acc);
	/* Later rounds read the secret from byte 3; the last 16 input bytes
	 * from byte 136 - 17 = 119.
	 */
	tail = mix16(in + len - 16, s + 136 - 17);
	for (i = 8; i < rounds; i++)
		tail += mix16(in + 16 * i, s + 16 * (i - 8) + 3);
	return xxh3_avalanche(acc + tail);
}

static void accumulate_512(uint64_t *acc, const unsigned char *in, const unsigned char *s)
{
	int i;

	for (i = 0; i < 8; i++) {
		uint64_t v = rd64(in + 8 * i);
		uint64_t k = v ^ rd64(s + 8 * i);

		acc[i ^ 1] += v;
		acc[i] += (uint64_t)(uint32_t)k * (k >> 32);
	}
}

static void scramble(uint64_t *acc, const unsigned char *s)
{
	int i;

	for (i = 0; i < 8; i++) {
		uint64_t a = acc[i];

		a ^= a >> 47;
		a ^= rd64(s + 8 * i);
		acc[i] = a * P32_1;
	}
}

static uint64_t hash_long(const unsigned char *in, size_t len)
{
	const unsigned char *s = xxh3_secret;
	uint64_t acc[8] = { P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1 };
	size_t blocks = (len - 1) / BLOCK, b, st, stripes;
	uint64_t h = len * P64_1;
	int i;

	for (b = 0; b < blocks; b++) {
		for (st = 0; st < STRIPES_PER_BLOCK; st++)
			accumulate_512(acc, in + b * BLOCK + st * STRIPE, s + st * 8);
		scramble(acc, s + SECRET_SIZE - STRIPE);
	}
	stripes = ((len - 1) - BLOCK * blocks) / STRIPE;
	for (st = 0; st < stripes; st++)
		accumulate_512(acc, in + blocks * BLOCK + st * STRIPE, s + st * 8);
	/* The last stripe, always the input's final 64 bytes. */
	accumulate_512(acc, in + len - STRIPE, s + SECRET_SIZE - STRIPE - 7);
	for (i = 0; i < 4; i++)
		h += mul128_fold64(acc[2 * i] ^ rd64(s + 11 + 16 * i),
				   acc[2 * i + 1] ^ rd64(s + 11 + 16 * i + 8));
	return xxh3_avalanche(h);
}

uint64_t kvmem_xxh3_64(const void *data, size_t len)
{
	const unsigned char *in = data;

	if (len <= 16)
		return len_0to16(in, len);
	if (len <= 128)
		return len_17to128(in, len);
	if (len <= 240)
		return len_129to240(in, len);
	return hash_long(in, len);
}
