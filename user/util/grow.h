/* SPDX-License-Identifier: MIT */
/* Growing arrays (private to the library). */
#ifndef KVMEM_UTIL_GROW_H
#define KVMEM_UTIL_GROW_H

#include <stddef.h>

/*
 * Make the array *(void **)pp of elements of `elem` bytes hold at least
 * `need` of them: the capacity *cap doubles, from `first` when it is 0, and
 * the new elements are zeroed. 0, or -ENOMEM with nothing changed (no
 * message: the caller says what it was growing).
 */
int kvmem_grow(void *pp, size_t elem, size_t need, size_t *cap, size_t first);

#endif
