/* SPDX-License-Identifier: MIT */
/* The gather kernel's checks (check_gather.c), run by kvmem_gpu_check. */
#ifndef KVMEM_TESTS_GPU_CHECK_GATHER_H
#define KVMEM_TESTS_GPU_CHECK_GATHER_H

/* One "ok"/"FAIL" line per case, on check_util.h's context and counts. */
void check_gather(void);

#endif
