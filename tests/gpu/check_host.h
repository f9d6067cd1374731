/* SPDX-License-Identifier: MIT */
/* The pinned rows' keeping (user/backend/cuda_host.c), run by kvmem_gpu_check. */
#ifndef KVMEM_TESTS_GPU_CHECK_HOST_H
#define KVMEM_TESTS_GPU_CHECK_HOST_H

/* One "ok"/"FAIL" line per case, on check_util.h's context and counts. */
void check_host(void);

#endif
