/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * XXH3-64 with seed 0 and the default secret: the checksum of the
 * workspace's sums file (Documentation/formats.md). The kernel has no XXH3,
 * so kvmem_xxh3.c is written from the public xxHash specification and
 * compiles both in the module and in userspace, where
 * tests/unit/test_kmod_xxh3.c checks it against libxxhash's XXH3_64bits.
 */
#ifndef KVMEM_XXH3_H
#define KVMEM_XXH3_H

#ifdef __KERNEL__
#include <linux/types.h>
#else
#include <stddef.h>
#include <stdint.h>
#endif

/* XXH3_64bits(data, len): seed 0, the 192-byte default secret. */
uint64_t kvmem_xxh3_64(const void *data, size_t len);

#endif
