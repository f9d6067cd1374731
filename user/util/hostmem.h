/* SPDX-License-Identifier: MIT */
/* What the process's mappings allow (private to the library). */
#ifndef KVMEM_UTIL_HOSTMEM_H
#define KVMEM_UTIL_HOSTMEM_H

#include <stddef.h>

/*
 * Whether every byte of [p, p + len) is mapped writable in this process
 * (/proc/self/maps): 1; 0 when some of it is mapped without write access
 * (the kernel module's window: a backend must pin it read-only); -ENOENT
 * when some of it is not mapped; -errno when the maps cannot be read. No
 * message: the caller says what it was pinning.
 */
int kvmem_host_writable(const void *p, size_t len);

#endif
