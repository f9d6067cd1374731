/* SPDX-License-Identifier: MIT */
/* The rows-to-pages copy's checks (check_pages.c), run by kvmem_gpu_check. */
#ifndef KVMEM_TESTS_GPU_CHECK_PAGES_H
#define KVMEM_TESTS_GPU_CHECK_PAGES_H

/* One "ok"/"FAIL" line per case, on check_util.h's context and counts. */
void check_pages(void);

#endif
