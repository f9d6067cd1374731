/* SPDX-License-Identifier: MIT */
/* The gather kernel's checks (check_gather.c), run by kvmem_gpu_check. */
#ifndef KVMEM_TESTS_GPU_CHECK_GATHER_H
#define KVMEM_TESTS_GPU_CHECK_GATHER_H

#include <stdint.h>

#include "kvmem/cuda.h"

/* One "ok"/"FAIL" line per case; counts into *pass / *fail. */
void check_gather(kvmem_cuda_ctx *c, int quick, uint64_t seed, int *pass, int *fail);

#endif
