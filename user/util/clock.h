/* SPDX-License-Identifier: MIT */
/* The monotonic clock the library times itself with (private to it). */
#ifndef KVMEM_UTIL_CLOCK_H
#define KVMEM_UTIL_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t kvmem_now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* The same in seconds. */
static inline double kvmem_now_s(void)
{
	return (double)kvmem_now_ns() * 1e-9;
}

#endif
