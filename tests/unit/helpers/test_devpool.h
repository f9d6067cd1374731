/* SPDX-License-Identifier: MIT */
/*
 * A device page pool for a backend that has none, so that what a GPU's pool
 * reports (backend_impl.h: host_register, page_cached, pool_watch) can be
 * tested where there is no GPU (the cpu backend, in the VM beside the
 * module). It models user/backend/cuda_page.c's pool: whole pages of the
 * registered region are copied into `slots` slots of host memory as they
 * are placed, a clock picks the victim (never a page the same place() call
 * reads), a pool hit is placed from the pool's copy, and every page that
 * enters or leaves is reported to the watcher. The view's bytes are the
 * same as without it, so a session still equals full attention.
 *
 * One wrapped backend at a time per process (the state is the helper's).
 */
#ifndef KVMEM_TEST_DEVPOOL_H
#define KVMEM_TEST_DEVPOOL_H

#include <stdint.h>

#include "backend/backend_impl.h"

typedef struct test_devpool_stats {
	uint64_t hits;		/* pages placed from the pool */
	uint64_t fills;		/* pages that entered it */
	uint64_t drops;		/* pages that left it */
	int held;		/* pages in it now */
} test_devpool_stats;

/* *out: `be` with a pool of `slots` pages (be stays its owner: close be,
 * not out, after test_devpool_unwrap). 0, or -EBUSY when one is wrapped. */
int test_devpool_wrap(kvmem_backend *out, const kvmem_backend *be, int slots);
void test_devpool_unwrap(void);
void test_devpool_stats_get(test_devpool_stats *st);
/* The pool slot of page (block, layer) of the registered region (of any
 * owner: the tests run one session at a time), or UINT32_MAX when the pool
 * does not hold it. */
uint32_t test_devpool_slot(int64_t block, int layer);

#endif
