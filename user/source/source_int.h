/* SPDX-License-Identifier: MIT */
/* The page sources' private parts, shared by the files of user/source/. */
#ifndef KVMEM_SOURCE_INT_H
#define KVMEM_SOURCE_INT_H

#include <stdint.h>

#include "kvmem/source.h"

/* kvmem_page_source_pager_commit for a kmod source (source_kmod.c): the
 * pager source inside commits, then the module follows. -EINVAL for any
 * other source. */
int source_kmod_commit(kvmem_page_source *src, const int32_t *ids, int64_t n, const void *app,
		       uint32_t app_len);

#endif
