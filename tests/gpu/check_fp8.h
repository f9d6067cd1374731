/* SPDX-License-Identifier: MIT */
/* fp8 KV's checks and timings (check_fp8.c), run by kvmem_gpu_check. */
#ifndef KVMEM_TESTS_GPU_CHECK_FP8_H
#define KVMEM_TESTS_GPU_CHECK_FP8_H

/* One "ok"/"FAIL" line per case, on check_util.h's context and counts;
 * with bench, then the fp8 / bf16 timing table. */
void check_fp8(int bench);

#endif
