/* SPDX-License-Identifier: MIT */
/* fp8 KV's checks and timings (check_fp8.c), run by kvmem_gpu_check. */
#ifndef KVMEM_TESTS_GPU_CHECK_FP8_H
#define KVMEM_TESTS_GPU_CHECK_FP8_H

#include <stddef.h>

#include "kernels/kernels_bf16.h"

/* One "ok"/"FAIL" line per case, on check_util.h's context and counts;
 * with bench, then the fp8 / bf16 timing table. */
void check_fp8(int bench);
/* The fp8 views' kernels (check_fp8_view.c): checks, then with bench the
 * view's decode and rematerialisation against bf16's. */
void check_fp8_view(int bench);

/* Pages of L x NB blocks, fp8 (with scales) or bf16, made from the same
 * random rows; in pinned host memory. */
struct pages {
	int L, H, D, B, NB, dtype;
	size_t page;		/* bytes of one page */
	char *host;		/* pinned */
};
int pages_make(struct pages *p, int L, int H, int D, int B, int NB, int dtype);
/* Block b's page of layer l (at base, laid out as p's), tokens u0..u0+n-1,
 * to slot. */
kvmem_gather_item page_item(const struct pages *p, const char *base, int l, int b, int u0,
			    int n, int slot);

#endif
